"""junit.xml: one test case per check, so a CI system shows kvparity's verdicts beside its own tests
(fail -> failure, error -> error, skip and inconclusive -> skipped, engine errors as one more case)."""

from __future__ import annotations

from typing import Any, Mapping
from xml.sax.saxutils import escape, quoteattr


def junit_xml(results: Mapping[str, Any]) -> str:
    checks = results["checks"]
    n_fail = sum(c["status"] == "fail" for c in checks.values())
    n_err = sum(c["status"] == "error" for c in checks.values()) + (1 if results["errors"] else 0)
    n_skip = sum(c["status"] in ("skip", "inconclusive") for c in checks.values())
    engine = str(results["run"].get("engine"))
    out = ['<?xml version="1.0" encoding="utf-8"?>',
           f'<testsuite name={quoteattr("kvparity." + engine)} tests="{len(checks) + (1 if results["errors"] else 0)}" '
           f'failures="{n_fail}" errors="{n_err}" skipped="{n_skip}" time="{results["duration_s"]}">']
    for name, c in checks.items():
        out.append(f'<testcase classname={quoteattr("kvparity." + engine)} name={quoteattr(name)}>')
        if c["status"] == "fail":
            text = "\n\n".join(f'{f["case_id"]}: {f["explanation"]}\n{f.get("replay", "")}' for f in c["failures"])
            out.append(f'<failure message={quoteattr(c["failures"][0]["title"])}>{escape(text)}</failure>')
        elif c["status"] == "error":
            out.append(f'<error message={quoteattr("; ".join(c["notes"]) or "error")}/>')
        elif c["status"] in ("skip", "inconclusive"):
            out.append(f'<skipped message={quoteattr(c["status"] + ": " + "; ".join(c["notes"][:3]))}/>')
        out.append("</testcase>")
    if results["errors"]:
        out.append(f'<testcase classname={quoteattr("kvparity." + engine)} name="engine">'
                   f'<error message={quoteattr(results["errors"][0])}/></testcase>')
    out.append("</testsuite>")
    return "\n".join(out) + "\n"
