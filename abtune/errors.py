"""One root exception; the CLI turns these into one line and an exit code, never a traceback."""


class AbtuneError(Exception):
    """Base of every error abtune raises on purpose."""

    exit_code = 1


class ConfigError(AbtuneError):
    """A configuration file or command-line value is wrong; the message names the field and the fix."""

    exit_code = 2


class TrainingFailed(AbtuneError):
    """A training run stopped: a worker died, the loss became NaN, or a collective failed."""

    exit_code = 1
