# Sourced by tests/run.sh and tests/sanitize.sh: the Open MPI settings of every test process.
# The PML: ob1, what Debian's Open MPI selects anyway on a machine without a PSM/OFI fabric
# (its openmpi-mca-params.conf excludes the ucx PML). Leaving cm in the candidates made every
# MPI process open it and its MTLs only to drop them: measured on this 2-core VM, 15 x
# `mpirun -np 4` of an MPI_Init/MPI_Finalize program took 6.9 s and 7.6 busy CPU-s, with
# `^cm,ucx` 3.9 s and 5.8 CPU-s; test_app and cli together 71 -> 43 s. A caller's own
# OMPI_MCA_pml (a CUDA-aware Open MPI whose GPU path is the ucx PML) is kept.
export OMPI_MCA_pml=${OMPI_MCA_pml:-^cm,ucx}
# hwloc's PCI discovery, which every MPI process runs (mpirun, and each rank when oversubscribed):
# it reads each PCI device's config space through sysfs, and in a VM each read traps to the
# hypervisor. An `mpirun -np 8` of fsdp_app for 2 steps took 565 CPU-ms with it, 370 without
# (perf: a fifth of its samples in pci_read_config). `-pci` alone does not stop it (the linuxio
# component reads the config space too): both are named. Only without a GPU: the tests use no
# PCI locality then (no NIC or GPU to place); with one, NCCL and CUDA-aware MPI may. A caller's
# own HWLOC_COMPONENTS is kept.
if [ ! -e /dev/nvidiactl ]; then export HWLOC_COMPONENTS=${HWLOC_COMPONENTS:--pci,-linuxio}; fi
