"""A module whose import takes ``SLOW_IMPORT_S`` seconds: a warm-start server still importing."""

import os
import time

time.sleep(float(os.environ.get("SLOW_IMPORT_S", "60")))
