"""An operating system error as the reader of a command's output is told it, in their language.

``OSError.strerror`` is the C library's English ("No such file or directory") in the middle of a Korean sentence;
the errors a command meets on a file it was given are named here, translated, and any other keeps the system's
words.
"""

from __future__ import annotations

import errno

from django.utils.translation import gettext_lazy as _

_KNOWN = {
    errno.ENOENT: _("no such file or folder"),
    errno.EACCES: _("permission denied"),
    errno.EPERM: _("operation not permitted"),
    errno.EISDIR: _("it is a folder"),
    errno.ENOTDIR: _("a part of the path is not a folder"),
    errno.ENOSPC: _("no space left on the device"),
    errno.EROFS: _("the file system is read-only"),
    errno.EEXIST: _("it exists already"),
    errno.ENAMETOOLONG: _("the name is too long"),
}


def os_error_text(exc: OSError) -> str:
    """What went wrong, without the path (the caller's sentence names it): translated where it is known."""
    known = _KNOWN.get(exc.errno) if exc.errno is not None else None
    return str(known) if known is not None else str(exc.strerror or exc)
