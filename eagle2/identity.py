"""``python -m eagle2.identity RESULTS``: the identity audit's command line. It audits new greedy turns
(``eagle2.bench.identity``, which loads the target), then prints the summary table
(``eagle2.results.identity_records``) and names every algorithmic divergence; the exit status is 1 when
there is one, 2 when a dtype's tolerance is unmeasured and not allowed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import eagle2.bench.identity as audit
from eagle2.results.identity_records import identity_table, load_audit_records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle2.identity", description=audit.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a results folder (paths.results of the runs), searched recursively")
    ap.add_argument("--override", action="append", default=[],
                    help="a Hydra override for loading the target, e.g. model.path=/local/dir (repeatable)")
    ap.add_argument("--redo", action="store_true", help="audit every turn again, not only new ones")
    ap.add_argument("--reference-dtype", choices=("auto", "run"), default="auto",
                    help="auto: float32 (float64 for float32 runs); run: the run's own dtype, tolerance doubled "
                         "(a 70B's fp32 reference, 282 GB, fits no single GPU machine)")
    ap.add_argument("--tolerance-factor", action="append", default=[], metavar="DTYPE=X",
                    help="a factor measured by experiments.research.numeric_tolerance, e.g. float16=5.0 (repeatable)")
    ap.add_argument("--allow-unmeasured", action="store_true",
                    help="audit float16 with bfloat16's borrowed factor (records say tolerance_measured: false)")
    args = ap.parse_args(argv)
    if not Path(args.results).is_dir():
        ap.error(f"results folder {args.results} does not exist")
    for item in args.tolerance_factor:
        dtype, _, value = item.partition("=")
        try:
            audit.set_tolerance_factor(dtype, float(value))
        except (KeyError, ValueError) as exc:
            ap.error(f"--tolerance-factor {item}: {exc} (expected DTYPE=X, e.g. float16=5.0)")
    try:
        new = audit.audit_results(args.results, args.override, args.redo, args.reference_dtype, args.allow_unmeasured)
    except audit.UnmeasuredToleranceError as exc:
        print(f"[identity] {exc}", file=sys.stderr)
        return 2
    table = identity_table(args.results)
    print(f"[identity] {len(new)} turns audited now")
    if not table.empty:
        print(table.to_markdown(index=False))
    bad = [r for r in load_audit_records(args.results) if r["status"] == "algorithmic"]
    for r in bad:
        print(f"[identity] ALGORITHMIC DIVERGENCE: {r['model']}/{r['dataset']}/{r['method']} {r['config_hash']} "
              f"question {r['question_id']} turn {r['turn']}: tokens at positions {r['off_greedy']} are beyond "
              f"the {r['dtype']} tolerance (max margin/tol {r['max_margin_over_tol']:.1f})", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
