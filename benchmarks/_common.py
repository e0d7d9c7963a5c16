"""What run.py and first_calls.py share: the MLP weights and MAML tasks
they build from NumPy, and printing a table as aligned text or markdown."""

import numpy as np

MAML_TASKS, MAML_SHOTS, MAML_INNER_STEPS, MAML_INNER_LR = 32, 10, 5, 0.01


def init_mlp(rng, sizes):
    """float32 weights `w{i}` (scaled by 1/sqrt(fan-in)) and biases `b{i}`."""
    params = {}
    for i in range(len(sizes) - 1):
        m, n = sizes[i], sizes[i + 1]
        params[f"w{i}"] = (rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32)
        params[f"b{i}"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
    return params


def maml_data(seed):
    """A 1-40-40-1 MLP and MAML_TASKS sine-regression tasks: support and
    query sets of MAML_SHOTS points each."""
    rng = np.random.default_rng(seed)
    params = init_mlp(rng, (1, 40, 40, 1))
    amp = rng.uniform(0.1, 5.0, (MAML_TASKS, 1, 1))
    phase = rng.uniform(0.0, np.pi, (MAML_TASKS, 1, 1))

    def sample():
        x = rng.uniform(-5.0, 5.0, (MAML_TASKS, MAML_SHOTS, 1))
        return x.astype(np.float32), (amp * np.sin(x + phase)).astype(np.float32)

    return (params, *sample(), *sample())


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
