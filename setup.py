"""Package layout: ``mia_engine`` from the repository root; the ``kernels/`` folder shipped as the import
package ``mia_kernels`` (a bare ``kernels`` would collide with Hugging Face's PyPI package of that name,
which ``transformers`` can import); and ``configs/`` shipped as ``mia_engine.configs`` so that
``--config default`` works from any install, editable or not. tests/test_packaging.py checks the
top-level names."""

from setuptools import find_packages, setup

KERNELS = [package.replace("kernels", "mia_kernels", 1) for package in find_packages(include=["kernels", "kernels.*"])]

setup(
    packages=find_packages(include=["mia_engine", "mia_engine.*"]) + KERNELS + ["mia_engine.configs"],
    package_dir={"mia_kernels": "kernels", "mia_engine.configs": "configs"},
    package_data={"mia_engine.configs": ["*.toml"], "mia_engine.config": ["*.json"]},
)
