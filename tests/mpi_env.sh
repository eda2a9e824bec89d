# Sourced by tests/run.sh and tests/sanitize.sh: the Open MPI settings of every test process.
# The PML: ob1, what Debian's Open MPI selects anyway on a machine without a PSM/OFI fabric
# (its openmpi-mca-params.conf excludes the ucx PML). Leaving cm in the candidates made every
# MPI process open it and its MTLs only to drop them: measured on this 2-core VM, 15 x
# `mpirun -np 4` of an MPI_Init/MPI_Finalize program took 6.9 s and 7.6 busy CPU-s, with
# `^cm,ucx` 3.9 s and 5.8 CPU-s; test_app and cli together 71 -> 43 s. A caller's own
# OMPI_MCA_pml (a CUDA-aware Open MPI whose GPU path is the ucx PML) is kept.
export OMPI_MCA_pml=${OMPI_MCA_pml:-^cm,ucx}
