"""``python -m sandbox.runtime``: run the reference Runtime until SIGINT/SIGTERM.

Tokens never come from argv: each is read, in order, from the systemd credential
(``$CREDENTIALS_DIRECTORY/<name>``), the ``--...-token-file`` path, or an environment
variable. A configuration problem prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping, Sequence

import trio

from config.load import ConfigError, load_secret
from config.settings import Secret
from daemon.core.canonical import canonical_digest
from daemon.core.handoff import TrustedRuntimeWorkScope
from daemon.core.retry import BackoffPolicy
from daemon.services import logs
from sandbox.runtime.runtime import DEFAULT_OPERATION, ReferenceRuntime
from sandbox.runtime.server import serve

DEMO_BINDING_DIGEST = canonical_digest({"binding": "sandbox-runtime"})
INTEGRATION_TOKEN_ENV = "SANDBOX_RUNTIME_INTEGRATION_TOKEN"  # noqa: S105 (a variable name)
RESULTS_TOKEN_ENV = "SANDBOX_RUNTIME_RESULTS_TOKEN"  # noqa: S105 (a variable name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.runtime",
        description="Reference CRM Runtime (in memory) for integrationd demos and tests.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default %(default)s)")
    parser.add_argument("--port", type=int, default=8790,
                        help="listen port; 0 picks a free one (default %(default)s)")
    parser.add_argument("--integration-url", required=True,
                        help="base URL of integrationd's service API, e.g. http://127.0.0.1:8781")
    parser.add_argument(
        "--integration-token-file",
        help="file holding the bearer token presented to integrationd (else the credential "
        f"runtime-integration-token or ${INTEGRATION_TOKEN_ENV})",
    )
    parser.add_argument(
        "--results-token-file",
        help="file holding the bearer token integrationd must present with receipts (else the "
        f"credential runtime-results-token or ${RESULTS_TOKEN_ENV})",
    )
    parser.add_argument("--org-id", default="org-demo",
                        help="trusted scope: org (default %(default)s)")
    parser.add_argument("--app-installation-id", default="app-demo",
                        help="trusted scope: App installation (default %(default)s)")
    parser.add_argument("--runtime-capability-id", default="cap-runtime-demo",
                        help="trusted scope: Runtime capability (default %(default)s)")
    parser.add_argument("--runtime-work-binding-digest", default=DEMO_BINDING_DIGEST,
                        help="trusted scope: Runtime work binding digest (default: a demo digest)")
    parser.add_argument("--catalog-revision", type=int, default=7,
                        help="Catalog revision stamped on intents (default %(default)s)")
    parser.add_argument("--operation", default=DEFAULT_OPERATION,
                        help="operation named in commands (default %(default)s)")
    parser.add_argument("--also-operation", action="append", default=[],
                        help="another operation each title change also hands off, as its"
                        " own intent (repeatable)")
    parser.add_argument("--old-runtime", action="store_true",
                        help="behave as a Runtime that predates result format 2 (rejects it)")
    parser.add_argument("--poll-interval", type=float, default=1.0,
                        help="outbox poll interval in seconds (default %(default)s)")
    parser.add_argument("--retry-cap", type=float, default=30.0,
                        help="longest delay between handoff retries, seconds (default %(default)s)")
    parser.add_argument("--log-level", default="INFO", help="log level (default %(default)s)")
    return parser


def _token(key: str, credential: str, path: str | None, env_var: str,
           environ: Mapping[str, str]) -> Secret:
    secret = load_secret(key=key, credential=credential, file_path=path, env_var=env_var,
                         environ=environ)
    if secret is None or not secret.reveal():
        raise ConfigError(key, f"missing: give --{key.replace('_', '-')}-file, the "
                               f"{credential} credential, or ${env_var}")
    return secret


def runtime_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> ReferenceRuntime:
    """Build the Runtime from parsed arguments; raises ``ConfigError`` naming the setting."""
    integration_token = _token("integration_token", "runtime-integration-token",
                               args.integration_token_file, INTEGRATION_TOKEN_ENV, environ)
    results_token = _token("results_token", "runtime-results-token",
                           args.results_token_file, RESULTS_TOKEN_ENV, environ)
    if not args.integration_url.startswith(("http://", "https://")):
        raise ConfigError("integration-url", "expected http://host:port or https://host:port")
    if not 0 <= args.port <= 65535:
        raise ConfigError("port", "expected 0..65535")
    if args.poll_interval <= 0 or args.retry_cap < 0.5:
        raise ConfigError("poll-interval", "poll interval must be > 0 and retry cap >= 0.5")
    return ReferenceRuntime(
        scope=TrustedRuntimeWorkScope(
            args.org_id, args.app_installation_id, args.runtime_capability_id,
            args.runtime_work_binding_digest,
        ),
        integration_url=args.integration_url,
        integration_token=integration_token,
        results_token=results_token,
        catalog_revision=args.catalog_revision,
        operation=args.operation,
        also_operations=tuple(args.also_operation),
        accept_no_effect_format=not args.old_runtime,
        poll_interval_s=args.poll_interval,
        dispatch_backoff=BackoffPolicy(base_s=0.5, cap_s=args.retry_cap, floor_s=0.05),
    )


async def _main(runtime: ReferenceRuntime, host: str, port: int) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            bound_port: int = await nursery.start(serve, runtime, host, port)
            logs.event("runtime_listening", host=host, port=bound_port,
                       accept_no_effect_format=runtime.accept_no_effect_format)
            async for signum in signals:
                logs.event("runtime_stopping", signal=signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        runtime = runtime_from_args(args, os.environ if environ is None else environ)
    except ConfigError as exc:
        print(f"sandbox.runtime: {exc}", file=sys.stderr)
        return 2
    try:
        logs.configure(args.log_level.upper())
    except ValueError:
        print(f"sandbox.runtime: log-level: unknown level {args.log_level!r}", file=sys.stderr)
        return 2
    trio.run(_main, runtime, args.host, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
