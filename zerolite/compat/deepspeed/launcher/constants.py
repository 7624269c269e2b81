"""`deepspeed.launcher.constants`: the names of DeepSpeed's multi-node launcher backends
(Accelerate reads them to build a `deepspeed` command line). zerolite's launcher starts this
node's ranks only; see runner.py for which of these it accepts."""

PDSH_LAUNCHER = "pdsh"
PDSH_MAX_FAN_OUT = 1024

OPENMPI_LAUNCHER = "openmpi"
MPICH_LAUNCHER = "mpich"
IMPI_LAUNCHER = "impi"
SLURM_LAUNCHER = "slurm"
MVAPICH_LAUNCHER = "mvapich"
MVAPICH_TMP_HOSTFILE = "/tmp/deepspeed_mvapich_hostfile"

ELASTIC_TRAINING_ID_DEFAULT = "123456789"
