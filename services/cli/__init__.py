"""Command-line entry points: `recoverd` (services, launcher) and `recoverctl` (operator CLI)."""
