"""taptree from Python: write and read trees, capture PyTorch and Hugging Face.

    from taptree import TreeWriter, open_tree, stages
    with TreeWriter("runs/py", stages=stages.llama(), run={"backend": "numpy"}) as w:
        w.tap(stages.ATTN_NORM, 0, (0, 7), x)

`taptree.torch` (forward hooks) and `taptree.hf` (the Hugging Face adapter)
need torch; import them explicitly. docs/ENGINES.md is the guide.
"""

from . import stages
from .select import Selection, SelectionError
from .tree import Tree, TreeError, TreeWriter, open_tree

__all__ = ["stages", "Selection", "SelectionError", "Tree", "TreeError", "TreeWriter", "open_tree"]
__version__ = "0.1.0"
