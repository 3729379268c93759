import sys

import ipywidgets as widgets
from IPython.display import display

import rlxviz
from rlxviz import teach
from rlxviz.runtime import blas_summary

print("python:", sys.executable)
print("rlxviz", rlxviz.__version__, "|", blas_summary())
