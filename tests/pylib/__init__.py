"""What the Python test suites share (tests/*/*.py, run by Debian's /usr/bin/python3):

  report   the one way a suite reports: a PASS/FAIL/SKIP line per case and Boost.Test-style
           "N test cases out of M passed/failed/skipped" lines, which tests/summary.py reads
  launch   the environment for mpirun as root on few cores, mpirun and fsdp_app command lines,
           running a command with its output in a log
  harness  a suite's scratch folder, fsdp_app launches and its Report (the checkpoint, fault and
           Slurm suites)
  metrics  reading fsdp_app's metrics file (JSON lines)
  ckpt     reading checkpoint files (h5py, numpy) and their names
  configs  the small models the end-to-end suites train
  venv     the Hugging Face venv (tests/reference/hf_venv.sh)
  reference  the common end of the Hugging Face reference checks (check_t5, check_llama)

A suite puts tests/ on sys.path once, at its top, and imports from here:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
    from pylib.report import Report
report, launch, metrics and venv need nothing outside the standard library; ckpt needs h5py and
numpy."""
