"""``integrationd cutover status|begin|commit|rollback|re-cutover FAMILY``.

* ``status``: the owner generation, its receipts, the rollback fences with the
  projector's progress, and what exactly blocks the next step.
* ``begin``: close the legacy owner's admission (nobody claims while it drains).
* ``commit``: prove zero legacy claimers and full coverage (and, after a
  rollback, the re-cutover rules), then write the receipt admitting integrationd.
* ``rollback``: close integrationd's claim and reclaim admission, then (once the
  claim-transaction bound has passed and everything drained) fence every
  unstarted item for the legacy owner and write its receipt. Run it again until
  it reports done; ``--gone ID`` records an operator's proof that a process is
  gone.
* ``re-cutover``: ``begin`` (when the legacy owner is active), then ``commit``.
* ``project``: run the legacy outcome projector once over every receipt.

Every step is authorized (admin) and audited. A blocked step is one line per
blocker and exit 1; an illegal step, an unknown process, bad input or a
statement of the configured legacy claimant that the database refuses (named
by its key, e.g. ``legacy_claimants[0].uncovered_sql``) is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from config.settings import Settings
from daemon.cli_commands import HELP
from daemon.core.cutover import IllegalStep
from daemon.core.cutover_text import CLAIMANT_TEXT, STEP_TEXT, phase_text
from daemon.services import cutover as service
from daemon.services.clock import WallClock
from daemon.services.families import UnknownFamily, known_family_names
from daemon.services.operator_api import authorize
from storage.cutover.steps import NotUnderCutover
from storage.cutover.values import CutoverBlocked, LegacyClaimantError, StepParams
from storage.work_store import WorkStore

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class CutoverUsage(Exception):
    """Input the operator can fix: one line, exit 2."""


def _seconds(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0..3600 seconds, got {text}")
    return int(value * 1_000_000)


def add_cutover_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cut = sub.add_parser("cutover", help=HELP["cutover"])
    verbs = cut.add_subparsers(dest="cutover_command", required=True, metavar="VERB")
    st = verbs.add_parser("status", help="owner generation, receipts, fences, blockers")
    st.add_argument("family", metavar="FAMILY")
    st.add_argument("--json", action="store_true", help="print JSON")
    for verb, text in (("begin", "close the legacy owner's admission"),
                       ("commit", "admit integrationd (after the zero-legacy proof)"),
                       ("rollback", "stop integrationd and fence its unstarted items"),
                       ("re-cutover", "begin, then commit, after a rollback")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("family", metavar="FAMILY")
        p.add_argument("--actor", required=True, help="operator name (must hold admin)")
        p.add_argument("--reason", required=True, help="why (kept in the audit log)")
        p.add_argument("--claim-tx-bound", type=_seconds, default=60_000_000,
                       metavar="SECONDS",
                       help="how long a claim begun before admission closed may still run"
                            " (default 60)")
        p.add_argument("--gone", action="append", default=[], metavar="PROCESS",
                       help="record that this replica or legacy process is gone (repeat)")
        p.add_argument("--json", action="store_true", help="print JSON")
    pr = verbs.add_parser("project", help="run the legacy outcome projector once")
    pr.add_argument("--json", action="store_true", help="print JSON")


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def _status_text(doc: dict[str, Any]) -> str:
    gen = doc["generation"]
    lines = [f"family {doc['family']}: " + (
        f"generation {gen['generation']}, {phase_text(gen['phase'])}"
        f" (claims: {CLAIMANT_TEXT[gen['claimant']]})"
        if gen else "not under cutover (integrationd claims; it never had another owner)")]
    lines.append(f"next step: {STEP_TEXT[doc['next_step']]}"
                 f" (integrationd cutover {doc['next_verb']})")
    lines += [f"  blocked: {b['sentence']} [{b['code']}]" for b in doc["blockers"]]
    lines += [f"  receipt {r['receipt_id']}: generation {r['generation']} ->"
              f" {CLAIMANT_TEXT.get(r['owner'], r['owner'])}"
              f" ({r['kind']}{', fence ' + r['fence_id'] if r['fence_id'] else ''},"
              f" {r['fenced_count']} fenced)" for r in doc["receipts"]]
    lines += [f"  fence {f['fence_id']}: {f['fenced']} fenced, {f['awaiting']} awaiting,"
              f" {f['reconciled']} reconciled, {f['unknown']} unknown,"
              f" {f['receipts_unprojected']} receipts unprojected"
              f"{' (confirmed)' if f['confirmed'] else ''}" for f in doc["fences"]]
    return "\n".join(lines) + "\n"


async def run_cutover_command(store: WorkStore, settings: Settings,
                              args: argparse.Namespace) -> int:
    verb = args.cutover_command
    now_us = WallClock().now_us()
    if verb == "project":
        report = await store.legacy_project(now_us, limit=1000)
        doc = {"reconciled": report.reconciled, "duplicate": report.duplicate,
               "conflict": report.conflict}
        if args.json:
            _print_json(doc)
        else:
            sys.stdout.write(f"projected {report.projected}: {report.reconciled} reconciled,"
                             f" {report.duplicate} duplicate, {report.conflict} conflict\n")
        return EXIT_OK
    family = str(args.family)
    if not family or len(family) > 64 or not family.isprintable():
        raise CutoverUsage("FAMILY must be a work family name (1..64 printable characters)")
    known = known_family_names()
    if family not in known:
        # A typo must not read as "not under cutover" (exit 0): refused as everywhere.
        raise UnknownFamily(family, known)
    if verb == "status":
        doc = await service.status(store, settings, family, now_us)
        if args.json:
            _print_json(doc)
        else:
            sys.stdout.write(_status_text(doc))
        return EXIT_OK
    authorize(settings, args.actor, "cutover.step")
    params = StepParams(family=family, actor=args.actor, reason=" ".join(args.reason.split()),
                        claim_tx_bound_us=args.claim_tx_bound)
    if not params.reason:
        raise CutoverUsage("a reason is required (it is kept in the audit log)")
    try:
        done = await service.step(store, settings, verb, params, now_us,
                                  gone=tuple(args.gone))
    except CutoverBlocked as exc:
        if args.json:
            _print_json({"done": False, "blockers": [
                {"code": b.code, "sentence": b.sentence} for b in exc.blockers]})
        else:
            for b in exc.blockers:
                sys.stderr.write(f"integrationd: cutover {verb} {family} blocked: {b.sentence}"
                                 f" [{b.code}]\n")
        return EXIT_FAILURE
    except (IllegalStep, NotUnderCutover, service.UnknownProcess,
            LegacyClaimantError) as exc:
        raise CutoverUsage(str(exc)) from None
    last = done[-1]
    if args.json:
        _print_json({"done": True, "generation": service.generation_json(last.generation),
                     "receipt": service.receipt_json(last.receipt) if last.receipt else None,
                     "moved": last.moved})
    else:
        gen = last.generation
        sys.stdout.write(f"cutover {verb} {family}: generation {gen.generation},"
                         f" {gen.phase.value} (claims: {gen.claimant.value})"
                         + (f"; receipt {last.receipt.receipt_id}" if last.receipt else "")
                         + (f"; {last.moved} items fenced" if last.receipt and
                            last.receipt.fence_id else "") + "\n")
    return EXIT_OK
