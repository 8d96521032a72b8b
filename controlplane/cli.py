"""``claimctl`` — the one command an operator runs, installed with the package (a wheel built from the checkout: ``pip wheel --no-deps -w dist .``, then
``pip install dist/claim_control_plane-*.whl``; it is not on PyPI);
it needs no checkout.

    claimctl run                 the embedded default: server + job worker + beat, one supervisor, one Ctrl-C
    claimctl up [--workers N]    the production profile on one host: serve + N workers + beat, supervised
    claimctl serve               the production server (gunicorn + uvicorn workers); needs PostgreSQL and a broker
    claimctl worker              a Celery worker (production: as many as you like)
    claimctl beat                the Celery beat (exactly one per deployment)
    claimctl migrate             apply the migrations
    claimctl issue-token --role worker --name w1        claimctl revoke-token PREFIX --reason … --as OPERATOR --yes
    claimctl fence NAMESPACE --reason … --as ONCALL      claimctl fence-check FENCE_ID
    claimctl gateway list | apply FILE | set-downstream NAME | set-rule SERVER TOOL  (--as OPERATOR; docs/mcp.md)
    claimctl check               Django's system checks (``--deploy`` for production's)
    claimctl manage COMMAND …    any other management command
    claimctl --version

Settings come from the environment (``DATABASE_URL``, ``CELERY_BROKER_URL``, ``SECRET_KEY``, …, docs/deployment.md).
``serve``, ``worker`` and ``beat`` replace this process with theirs (``exec``), so a supervisor's signals reach them
directly (systemd, Kubernetes, supervisord: one of each per unit); ``run`` and ``up`` supervise theirs
(``controlplane.supervise``). ``serve``, ``worker``, ``beat`` and ``up`` refuse to start on the embedded default.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from . import __version__

SETTINGS = "controlplane.settings"
MANAGEMENT = {  # claimctl's name → the management command it runs
    "migrate": "migrate",
    "issue-token": "issue_token",
    "revoke-token": "revoke_token",
    "fence": "fence",
    "fence-check": "fence_check",
    "gateway": "gateway",
    "check": "check",
}
USAGE = __doc__ or ""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    if not args or args[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command in ("--version", "version"):
        print(f"claimctl {__version__}")
        return 0
    if command in MANAGEMENT:
        return _manage([MANAGEMENT[command], *rest])
    if command == "manage":
        return _manage(rest)
    if command == "serve":
        _production_only(command)
        conf = _package_file("gunicorn_conf.py")
        return _exec(_python("-m", "gunicorn", "-c", conf, "controlplane.asgi:application", *rest))
    if command == "worker":
        _production_only(command)
        return _exec(_python("-m", "celery", "-A", "controlplane", "worker", "--loglevel", "INFO", *rest))
    if command == "beat":
        _production_only(command)
        beat = ["-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO", *_schedule(rest), *rest]
        return _exec(_python(*beat))
    if command == "run":
        from .supervise import run_embedded

        return run_embedded(rest)
    if command == "up":
        _production_only(command)
        from .supervise import run_production

        return run_production(rest)
    print(f"claimctl: no command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def _manage(argv: list[str]) -> int:
    from django.core.management import execute_from_command_line

    execute_from_command_line(["claimctl", *argv])
    return 0


def _python(*argv: str) -> list[str]:
    return [sys.executable, *argv]


def _package_file(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def _schedule(rest: list[str]) -> list[str]:
    """Beat's schedule file in the var directory, unless one is given."""
    if any(arg in ("-s", "--schedule") or arg.startswith("--schedule=") for arg in rest):
        return []
    import django

    django.setup()
    from django.conf import settings

    return ["--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME]


def _production_only(command: str) -> None:
    """The production profile refuses the embedded default: SQLite serialises every writer and its broker is a
    file — fine for ``claimctl run`` on one machine, never for servers and workers a team deploys."""
    missing = [
        f"{name} (got {os.environ.get(name) or 'nothing'})"
        for name, prefixes in (
            ("DATABASE_URL", ("postgres",)),
            ("CELERY_BROKER_URL", ("redis", "amqp", "rediss")),
        )
        if not os.environ.get(name, "").startswith(prefixes)
    ]
    if missing:
        print(
            f"claimctl {command}: the production profile needs PostgreSQL and a real broker; set "
            + " and ".join(missing)
            + " — or run `claimctl run` for the embedded default (SQLite, one machine).",
            file=sys.stderr,
        )
        raise SystemExit(2)


def _exec(argv: list[str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
