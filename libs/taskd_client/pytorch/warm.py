"""The warm spare's side: wait, with the framework already imported, to be given a rank.

``recoverd agent --warm-spares N`` starts N extra processes of the job's command with
``RECOVERD_WARM_SPARE_FD`` set. A script that calls :func:`wait_for_rank` before it reads its rank
blocks there (``import torch`` and this package are done by then). When a rank must be restarted,
the agent writes that rank's environment and log file down the pipe: this process takes them and
carries on as the rank, without paying interpreter start-up and imports. For any other process
(``RECOVERD_WARM_SPARE_FD`` unset) it returns at once.
"""

from __future__ import annotations

import json
import os
import sys
import time

__all__ = ["SPARE_FD_ENV", "wait_for_rank"]

SPARE_FD_ENV = "RECOVERD_WARM_SPARE_FD"  # the agent's launcher sets it (recoverd.agent.launcher)


def _warm_up() -> None:
    """Pay PyTorch's first-use costs now, not as the replacement: the first optimizer takes ~1 s
    (lazy imports behind torch.optim), the first backward pass starts autograd's machinery."""
    import torch

    weight = torch.zeros(8, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=0.1, momentum=0.9)
    (weight * 2.0).sum().backward()
    optimizer.step()
    torch.optim.Adam([weight]).step()


def wait_for_rank() -> bool:
    """Block until the agent gives this warm spare a rank; False at once when not a warm spare.

    Exits 0 if the agent closes the pipe without a rank (the agent is stopping).
    """
    fd_text = os.environ.pop(SPARE_FD_ENV, None)
    if fd_text is None:
        return False
    _warm_up()
    ready = time.time()
    print(f"warm spare pid {os.getpid()} ready", flush=True)
    with os.fdopen(int(fd_text), "rb") as pipe:
        line = pipe.readline()
    if not line:
        sys.exit(0)
    message = json.loads(line)
    os.environ.update({str(k): str(v) for k, v in message["env"].items()})
    log_path = message.get("log_path")
    if log_path:
        sys.stdout.flush()
        sys.stderr.flush()
        target = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(target, 1)
        os.dup2(target, 2)
        os.close(target)
    print(
        f"warm spare pid {os.getpid()} is rank {message.get('rank')}: waited {time.time() - ready:.1f}s,"
        " framework imported beforehand",
        flush=True,
    )
    return True
