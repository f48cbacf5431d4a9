"""A collector inside this process for one `fleetprof.profile()` block in local mode: the embedded server of
`fleetprof up` (SQLite, tasks in-process) on a loopback port chosen by the kernel, in a temporary folder, with one
operator token. Nothing of it outlives the block: `close()` stops it and removes the folder."""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from pathlib import Path

from fleetprof.errors import CliError
from fleetprof.ports import listen

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0


class LocalCollector:
    def __init__(self, data_dir: Path | None = None):
        import uvicorn

        from server.app import create_app
        from server.auth.service import create_token
        from server.config import ServerSettings
        from server.db import make_engine, make_sessionmaker, session_scope

        self._own_dir = data_dir is None
        self.data_dir = Path(tempfile.mkdtemp(prefix="fleetprof-local-")) if data_dir is None else data_dir
        # Given explicitly, so that a FLEETPROF_DATABASE_URL / BROKER_URL in the environment cannot send the block's
        # data to a shared database: local mode is this process's own SQLite. No automatic captures: nobody is
        # there to look at them, and a block is too short for a step-time baseline.
        self.settings = ServerSettings(database_url=None, broker_url=None, data_dir=self.data_dir,
                                       capture_auto=False, environment="development")
        for noisy in ("alembic", "alembic.runtime.migration"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
        sock = listen("127.0.0.1", 0, "local collector", "FLEETPROF_SERVER_URL")
        port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        # log_config=None: the user's program keeps its own logging configuration (uvicorn's would dictConfig it)
        self._server = uvicorn.Server(uvicorn.Config(create_app(self.settings), log_config=None, log_level="warning",
                                                     access_log=False, lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="fleetprof-local-collector", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise CliError("fleetprof.profile: the local collector did not start")
            time.sleep(0.02)
        # The app's start-up migrated the embedded database (server.app lifespan): the token's table is there.
        engine = make_engine(self.settings)
        try:
            with session_scope(make_sessionmaker(engine)) as session:
                self.token = create_token(session, scope="operator", description="fleetprof.profile local mode")
        finally:
            engine.dispose()

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
