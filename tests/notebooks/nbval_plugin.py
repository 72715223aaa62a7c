"""nbval's configuration for the committed notebooks (`pytest --nbval -p tests.notebooks.nbval_plugin`).

nbval re-executes a notebook and compares each output with the stored one. Left out of the comparison, as
TransformerLens does for its demos: images (nbval's default), widget model ids (nbval's default), HTML (every
table is also shown as text/plain, which is compared) and progress bars (tqdm's first frame, dropped from the
committed notebooks by notebook_outputs.strip_volatile and here from the fresh run). What a near-tie may change is
masked by nbval_sanitize.cfg.
"""
import nbval.plugin

from sinklib.notebook_outputs import is_progress_bar

SKIPPED = ("text/html",)
_compare_outputs = nbval.plugin.IPyNbCell.compare_outputs


def compare_outputs(self, test, ref, skip_compare=None):
    skip_compare = tuple(skip_compare or self.parent.skip_compare) + SKIPPED
    return _compare_outputs(self, [o for o in test if not is_progress_bar(o)],
                            [o for o in ref if not is_progress_bar(o)], skip_compare)


nbval.plugin.IPyNbCell.compare_outputs = compare_outputs
