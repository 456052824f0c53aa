"""One error type per cause. The CLI prints a `RoboloopError` as one line (the traceback behind `-v`).

Library code raises these where the cause is known (a destination that is not ours, a full
disk, S3 credentials, an unknown task); `from_os_error` turns the OS's errno into the same
kind of one-line, actionable message.
"""

from __future__ import annotations

import errno


class RoboloopError(Exception):
    """A failure whose cause the user can act on. `exit_code` is what the CLI returns."""

    exit_code = 2


class DestinationExistsError(RoboloopError, FileExistsError):
    """A destination exists and roboloop did not create it (or was not asked to replace it)."""


class BusyError(RoboloopError):
    """Another roboloop process is writing the same output right now."""


class OutputOwnershipError(RoboloopError, ValueError):
    """An output folder belongs to another run (different config, dataset or steps)."""


class S3Error(RoboloopError):
    """An S3 request failed for a reason named in the message."""


class S3CredentialsError(S3Error):
    pass


class S3BucketError(S3Error):
    pass


class S3EndpointError(S3Error):
    pass


class S3KeyError(S3Error):
    pass


class DiskFullError(RoboloopError):
    pass


class ReadOnlyError(RoboloopError):
    pass


class UnknownTaskError(RoboloopError, ValueError):
    pass


class ModelMismatchError(RoboloopError, ValueError):
    """A model does not fit the environment or data it is used with (state/action dimensions)."""


class CorruptFileError(RoboloopError, ValueError):
    """A file roboloop needs exists but cannot be read (truncated, corrupt, not what it claims)."""


class UntrustedFileError(RoboloopError, ValueError):
    """A file asks to run code or build objects when read (a pickle where data belongs): refused, nothing run."""


def from_os_error(e: OSError, doing: str = "") -> RoboloopError | None:
    """The cause of an OSError as a roboloop error, or None when it is not one we can name better."""
    where = e.filename or doing or "the destination"
    text = str(e)
    if e.errno is None:  # pyarrow and PyAV put the OS error in the message only
        for code, needle in ((errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system"),
                             (errno.EDQUOT, "Disk quota exceeded")):
            if needle in text:
                return from_os_error(OSError(code, needle, e.filename), doing or text.split(":")[0])
    if e.errno == errno.ENOSPC:
        return DiskFullError(f"no space left on the device while writing {where}: free space or choose another "
                             "destination (nothing half-written was left behind)")
    if e.errno == errno.EDQUOT:
        return DiskFullError(f"disk quota exceeded while writing {where}")
    if e.errno == errno.EROFS:
        return ReadOnlyError(f"{where} is on a read-only file system: choose a writable destination")
    if e.errno in (errno.EACCES, errno.EPERM):
        return ReadOnlyError(f"permission denied: {where}")
    return None
