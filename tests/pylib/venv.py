"""The Hugging Face venv (transformers 4.36.2 over Debian's torch): tests/reference/hf_venv.sh
makes it on first use (PyPI once) and prints its interpreter."""
import os
import subprocess

from pylib.launch import Fail

HF_VENV_SH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference", "hf_venv.sh")


def hf_python():
    """The venv's python; Fail naming hf_venv.sh's last line when it cannot be made."""
    r = subprocess.run(["bash", HF_VENV_SH], capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        msg = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise Fail(f"the Hugging Face venv: {msg}")
    return r.stdout.strip().splitlines()[-1]
