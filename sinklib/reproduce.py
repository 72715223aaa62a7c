"""The command `python -m sinklib.reproduce` (`make figures`, `make check`; `--help` lists its options): the runner
itself is sinklib.lab.reproduce, in the notebooks' tier."""
from sinklib.lab.reproduce import main

if __name__ == "__main__":
    main()
