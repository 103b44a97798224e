"""Horo's framework-agnostic core: the compiled runtime (cffi), errors, settings, launcher
detection and rendezvous, shared by horo_torch and horo_tf."""
__version__ = "0.1.0"
