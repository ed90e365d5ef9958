"""Every notebook executes top to bottom (tiny budgets), so the narrative never rots.

The kernel is this interpreter: jupyter_client runs a kernelspec whose command is ``python``
with ``sys.executable``, and when no ``python3`` kernelspec is installed (a fresh clone whose
venv lacks the shared data folder) one is written to a temporary Jupyter path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory):
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    with pytest.MonkeyPatch.context() as patch:
        try:
            KernelSpecManager().get_kernel_spec("python3")
        except NoSuchKernel:
            from ipykernel.kernelspec import install

            prefix = tmp_path_factory.mktemp("jupyter")
            install(prefix=str(prefix), kernel_name="python3")
            patch.setenv("JUPYTER_PATH", str(prefix / "share" / "jupyter"))
        yield "python3"


def test_every_notebook_is_there():
    assert [p.name for p in NOTEBOOKS] == [
        "01_quickstart.ipynb", "02_multi_fidelity.ipynb", "03_gpu_training.ipynb",
        "04_memory_wall.ipynb"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes(path, kernel_name, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    # Run in a scratch folder: any database or artifacts a notebook writes stay out of the repo.
    client = NotebookClient(notebook, kernel_name=kernel_name, timeout=240,
                            resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [out for cell in notebook.cells if cell.cell_type == "code"
              for out in cell.get("outputs", []) if out.get("output_type") == "error"]
    assert not errors
