"""`deepspeed.launcher`: DeepSpeed's launcher modules (their constants and command lines) run by
zerolite's launcher (zerolite/cli/launch.py): `runner` is the `deepspeed` command, `launch`
the per-node launcher it starts."""
