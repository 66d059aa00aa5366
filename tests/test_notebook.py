"""examples/quickstart.ipynb runs top to bottom on a real Jupyter kernel."""
from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import has_shared_trace

pytestmark = pytest.mark.slow  # runs the quickstart notebook in a Jupyter kernel

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "examples" / "quickstart.ipynb"


def test_quickstart_notebook_runs():
    nbformat = pytest.importorskip("nbformat", reason="the notebook test needs the `notebook` extra")
    nbclient = pytest.importorskip("nbclient", reason="the notebook test needs the `notebook` extra")
    pytest.importorskip("ipykernel", reason="the notebook test needs the `notebook` extra")
    pytest.importorskip("plotly", reason="the notebook plots need the `report` extra")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # committed without outputs, so diffs show code changes only
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")
    # cwd = examples/, as Jupyter would start it; a failing cell raises CellExecutionError
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # the three plots rendered as plotly figures, not as a repr string
    figures = [o for o in outputs if o.output_type in ("display_data", "execute_result")
               and "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(figures) == 3
    mfu = [o for o in outputs if "text/html" in o.get("data", {}) and "mfu_pct" in o["data"]["text/html"]]
    assert mfu, "MFU table missing"
    roofline = figures[2]["data"]["application/vnd.plotly.v1+json"]["layout"]["title"]["text"]
    if has_shared_trace("astra-sim/megatron_tp8"):  # the GPU trace: MFU and a roofline
        assert "A100-SXM4-80GB" in mfu[0]["data"]["text/html"] and roofline.startswith("Roofline")
    else:  # the CPU sample only: the roofline panel says why it is empty
        assert "no data" in str(figures[2]["data"]["application/vnd.plotly.v1+json"]["layout"]["annotations"])
    tables = [o for o in outputs if "text/html" in o.get("data", {}) and "late_count" in o["data"]["text/html"]]
    assert tables, "straggler_attribution table missing"
    whatif = [o for o in outputs if "text/html" in o.get("data", {}) and "links 4x faster" in o["data"]["text/html"]]
    assert whatif and "predicted_step_ns" in whatif[0]["data"]["text/html"], "what-if table missing"
    doctor = [o for o in outputs if "text/html" in o.get("data", {}) and "saving_pct" in o["data"]["text/html"]]
    assert doctor and "straggler" in doctor[0]["data"]["text/html"], "doctor's findings missing"
