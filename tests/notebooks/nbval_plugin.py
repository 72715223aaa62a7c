"""nbval's configuration for the committed notebooks (`pytest --nbval -p tests.notebooks.nbval_plugin`).

nbval re-executes a notebook and compares each output with the stored one. Left out of the comparison, as
TransformerLens does for its demos: images (nbval's default), widget model ids (nbval's default), HTML (every
table is also shown as text/plain, which is compared) and progress bars (tqdm's first frame, dropped from the
committed notebooks by notebook_outputs.strip_volatile and here from the fresh run). What a near-tie may change is
masked by nbval_sanitize.cfg.
"""
import importlib.util
from pathlib import Path

import nbval.plugin

# sinklib/lab/notebook_outputs.py read as a file of its own (it imports only the standard library): `import
# sinklib.lab.notebook_outputs` would run the package's __init__, torch and transformers with it, 3 s in each of nbval's
# three processes before the first kernel starts
_spec = importlib.util.spec_from_file_location("sinklib_notebook_outputs",
                                               Path(__file__).resolve().parents[2] / "sinklib" / "lab" / "notebook_outputs.py")
_outputs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_outputs)
is_progress_bar = _outputs.is_progress_bar

SKIPPED = ("text/html",)
_compare_outputs = nbval.plugin.IPyNbCell.compare_outputs


def compare_outputs(self, test, ref, skip_compare=None):
    skip_compare = tuple(skip_compare or self.parent.skip_compare) + SKIPPED
    return _compare_outputs(self, [o for o in test if not is_progress_bar(o)],
                            [o for o in ref if not is_progress_bar(o)], skip_compare)


nbval.plugin.IPyNbCell.compare_outputs = compare_outputs
