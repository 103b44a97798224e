"""Version of the hororun launcher when horo_core does not report one."""
__version__ = "0.1.0"
