from .main import main, run

__all__ = ["main", "run"]
