"""The message format's hot loops in C (broker/log/_codec.c, docs/storage.md "The codec"); the
rest of the package is declared in pyproject.toml. The codec needs gcc, the Python headers and
Debian's libxxhash-dev (scripts/setup installs them). Optional: where it does not build, pip
still installs pylog, which then runs the same code in Python (broker.log.codec). Here and not
in pyproject.toml's [tool.setuptools] ext-modules, which setuptools still calls experimental
and warns about on every install."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("broker.log._codec", ["broker/log/_codec.c"], optional=True)])
