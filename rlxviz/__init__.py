"""rlxviz: make ML-compiler fusion visible (IR, explained fusion passes, MLX runtime, viz, app)."""

__version__ = "0.1.0"
