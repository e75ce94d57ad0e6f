"""One P3 (c) trial of the checkout at ``argv[1]``, run with that checkout's own venv: for A/B
comparisons of two revisions on one machine, alternated (bench.py compares systems, not code).

    git worktree add ../old <rev> && (cd ../old && make venv torch)
    for i in $(seq 8); do
      ../old/.venv/bin/python bench/ab_trial.py ../old old; .venv/bin/python bench/ab_trial.py . new
    done | grep RESULT

Prints ``RESULT <label> <ms>``: SIGKILL of rank 1 -> the next completed step, as bench.py's P3 (c).
"""

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(sys.argv[1]).resolve() / "bench"))
import bench  # the checkout's own bench module and code

work = Path(tempfile.mkdtemp(prefix="ab-"))
try:
    with bench.start_system(work, "recoverd-in-place", "t", 400) as job:
        bench.wait("the warm-start server", lambda: " ready in " in job.out.read_text(), 180)
        pid, killed = bench.kill_after_step(job, 1, 40, 0.004)
        took = bench.wait("the next step", lambda: bench.time_to_next_step(job, killed, pid), 120)
    print(f"RESULT {sys.argv[2]} {took * 1000:.0f}")
finally:
    shutil.rmtree(work, ignore_errors=True)
