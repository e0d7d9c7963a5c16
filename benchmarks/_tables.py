"""Printing a benchmark table as aligned text or as markdown (shared by
run.py and first_calls.py)."""


def render(title, headers, rows, markdown, notes=()):
    """One table, as aligned text or as markdown."""
    lines = []
    if markdown:
        lines += [f"### {title}", "", "| " + " | ".join(headers) + " |",
                  "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines += [""] + [f"{n}" for n in notes]
    else:
        widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

        def line(cells):
            first = f"{cells[0]:<{widths[0]}}"
            return "  ".join([first] + [f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:])])

        lines += [title, line(headers), "-" * len(line(headers))]
        lines += [line(r) for r in rows]
        lines += [f"  {n}" for n in notes]
    print("\n".join(lines) + "\n", flush=True)
