"""One root exception; the CLI turns these into one line and an exit code, never a traceback."""

INTERRUPTED_EXIT = 130  # a command stopped by Ctrl-C, as a shell reports one ended by SIGINT (128 + 2)


class AbtuneError(Exception):
    """Base of every error abtune raises on purpose."""

    exit_code = 1


class ConfigError(AbtuneError):
    """A configuration file or command-line value is wrong; the message names the field and the fix."""

    exit_code = 2


class TrainingFailed(AbtuneError):
    """A training run stopped: a worker died, the loss became NaN, or a collective failed."""

    exit_code = 1
