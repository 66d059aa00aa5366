"""Doctor's findings for people: a ranked text table (the terminal) or Markdown (a PR, a report)."""
from __future__ import annotations


def _saving(f) -> str:
    if f["saving_ns"] is None:
        return "not predicted"
    return f"{f['saving_ns'] / 1e6:+.1f} ms ({f['saving_pct']:.1f}%)".replace("+", "-", 1) \
        if f["saving_ns"] < 0 else f"{f['saving_ns'] / 1e6:.1f} ms ({f['saving_pct']:.1f}%)"


def table(findings: list[dict]) -> str:
    if not findings:
        return "no findings: nothing the analyses show slows this job by 5% of a step or more\n"
    out = []
    for i, f in enumerate(findings, 1):
        who = "" if f["rank"] is None else f" [rank {f['rank']}]"
        out.append(f"{i}. {f['kind']}{who}: {f['title']}")
        out.append(f"   saving: {_saving(f)}" + ("" if f["predicted_step_ns"] is None else
                   f"   (step {f['measured_step_ns'] / 1e6:.1f} -> {f['predicted_step_ns'] / 1e6:.1f} ms, "
                   f"confidence {f['confidence']})"))
        for e in f["evidence"]:
            out.append(f"   evidence ({e['analysis']}): {e['figure']}")
        out.append(f"   fix: {f['fix']}")
        out.append(f"   assumes: {f['assumptions']}")
        if f["scenario"]:
            out.append(f"   scenario: {f['name']}.toml (tracekit doctor --out DIR writes it)")
    return "\n".join(out) + "\n"


def markdown(findings: list[dict]) -> str:
    if not findings:
        return "No findings: nothing the analyses show slows this job by 5% of a step or more.\n"
    out = ["| # | kind | rank | finding | predicted saving | confidence |", "| ---: | --- | ---: | --- | ---: | --- |"]
    for i, f in enumerate(findings, 1):
        out.append(f"| {i} | {f['kind']} | {'' if f['rank'] is None else f['rank']} | {f['title']} | {_saving(f)} | "
                   f"{f['confidence']} |")
    for i, f in enumerate(findings, 1):
        out += ["", f"**{i}. {f['title']}**", ""]
        out += [f"- evidence ({e['analysis']}): {e['figure']}" for e in f["evidence"]]
        out += [f"- fix: {f['fix']}", f"- assumes: {f['assumptions']}"]
        if f["scenario"]:
            out += ["", "```toml", f["scenario"].rstrip(), "```"]
    return "\n".join(out) + "\n"
