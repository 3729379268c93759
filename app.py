"""`panel serve app.py`: build the template and make it servable; all logic lives in rlxviz.app."""

from rlxviz.app.main import build_app

build_app().servable()
