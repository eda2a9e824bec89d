"""fsdp_app's metrics file (output.metrics: one JSON object a line): training step rows carry
"step" and "loss" (and "grad_norm" when clipping), evaluation rows "eval_loss", the last one the
"done" event."""
import json
import os


def rows(path):
    """Every row, in file order; [] when the file does not exist."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]


def step_rows(path):
    """The training step rows (those with a loss), in file order."""
    return [r for r in rows(path) if "loss" in r]


def step_losses(path):
    """[(step, loss)] of every training step row, in file order."""
    return [(r["step"], r["loss"]) for r in step_rows(path)]


def losses_by_step(path):
    """{step: loss} (a step logged twice keeps its last row)."""
    return {r["step"]: r["loss"] for r in step_rows(path) if "step" in r}


def eval_rows(path):
    return [r for r in rows(path) if "eval_loss" in r]
