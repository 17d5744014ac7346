"""Renders REPORT.md from REPORT.in.md: {{file:...}}, {{section:file:from:to}}, and {{NAME}} from parts/NAME.md."""
import os, re
here = os.path.dirname(os.path.abspath(__file__))
t = open(os.path.join(here, "REPORT.in.md")).read()
def sub(m):
    spec = m.group(1)
    if spec.startswith("file:"):
        return open(os.path.join(here, spec[5:])).read().rstrip("\n")
    if spec.startswith("section:"):
        _, f, a, b = spec.split(":")
        s = open(os.path.join(here, f)).read()
        i, j = s.index(a), s.index(b)
        return "WITH …\n), " + s[i:j].rstrip().rstrip(",") + "\n…"
    return open(os.path.join(here, "parts", spec + ".md")).read().rstrip("\n")
for _ in range(3):
    t = re.sub(r"\{\{([^}]+)\}\}", sub, t)
open(os.path.join(here, "REPORT.md"), "w").write(t)
