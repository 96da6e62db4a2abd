"""`engram-admin`'s commands report what stops them in one line (services/admin.py)."""

from __future__ import annotations

import pytest

from services.admin import run_admin
from shared.crypto import MasterKeyMismatch


def test_a_data_key_wrapped_by_another_master_key_is_one_line_and_exit_2(capsys):
    """A replay after a master-key rotation is one line and exit 2, not a MasterKeyMismatch
    traceback."""

    async def replay():
        raise MasterKeyMismatch(
            "a data key in Redis is wrapped by master key 0707…, but this process has 01e9…"
        )

    with pytest.raises(SystemExit) as stopped:
        run_admin("replay", replay())
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("engram-admin replay: a data key in Redis is wrapped by master key")
        and "Traceback" not in err
    )
