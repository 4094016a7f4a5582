"""A stand-in for SGLang in the serving-benchmark tests (SGLang needs a GPU): put this folder's
parent on PYTHONPATH and ``python -m sglang.launch_server ...`` starts `launch_server` below."""

__version__ = "0.5.23"
