"""The lab: the notebooks' tier, above the library (nothing in sinklib outside this folder imports it).

nbNN_name.py: notebook NN_name.ipynb's run config, its pick_… / draw_… / report_… functions and its verdicts
(a new notebook is its .ipynb, one module here and a line of mkdocs.yml's nav). runs.py: the parts every run
config shares and RUNS; verdicts.py: how a claim is judged; reproduce.py, schedule.py, stores.py,
agreement*.py and notebook_outputs.py: `make figures` and `make check`."""
