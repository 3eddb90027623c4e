"""Each front end installs from this repository alone, the way its users install extensions.

- ComfyUI: the repository cloned into ``custom_nodes/`` is imported by ComfyUI's own loader logic (a package
  named after its path, from its ``__init__.py``); it registers the node from the clone's ``src/``.
- AUTOMATIC1111 / Forge: the repository cloned into ``extensions/`` has exactly one webui script in
  ``scripts/`` (the webui executes every ``scripts/*.py`` at an extension's root) and no install step.
The clone is simulated by copying the repository's files (tracked and new, not ignored) into a temporary folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def clone_into(folder: Path) -> Path:
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    target = folder / "tokenmerge"
    for name in files:
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def run_python(code: str, cwd: Path) -> str:
    """Run ``code`` in a fresh interpreter whose tokenmerge can only come from where the code puts it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # The test environment has tokenmerge installed in editable mode; hide that install so the clone must serve.
    code = (
        "import sys, importlib.abc\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in type(f).__module__ + str(f)]\n"
        f"sys.path[:] = [p for p in sys.path if p != {str(ROOT / 'src')!r}]\n" + code
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_comfyui_loads_the_cloned_repository_as_a_custom_node(tmp_path):
    pytest.importorskip("comfy")
    clone = clone_into(tmp_path / "ComfyUI" / "custom_nodes")
    out = run_python(
        f"""
import importlib.util, os
module_path = {str(clone)!r}
# ComfyUI's nodes.load_custom_node for a folder (v0.3.x-0.19.x): named after its path, loaded from __init__.py
sys_module_name = module_path.replace(".", "_x_")
spec = importlib.util.spec_from_file_location(sys_module_name, os.path.join(module_path, "__init__.py"))
module = importlib.util.module_from_spec(spec)
sys.modules[sys_module_name] = module
spec.loader.exec_module(module)
node = module.NODE_CLASS_MAPPINGS["TokenMergingTokenmerge"]
import tokenmerge, torch
assert tokenmerge.__file__.startswith(module_path), tokenmerge.__file__
from tokenmerge.tools.comfy_models import build_comfy_patcher, comfy_run
patcher = build_comfy_patcher("sd15-small")
(patched,) = node().patch(patcher, ratio=0.5)
x = torch.randn(2, 4, 16, 16)
out = comfy_run(patched, x, context=torch.randn(2, 7, 32))
print(module.NODE_DISPLAY_NAME_MAPPINGS["TokenMergingTokenmerge"], tuple(out.shape))
""",
        cwd=tmp_path,
    )
    assert "Token Merging (tokenmerge) (2, 4, 16, 16)" in out


def test_webui_extension_clone_has_one_webui_script_and_imports_from_its_clone(tmp_path):
    clone = clone_into(tmp_path / "webui" / "extensions")
    # The webui's rule: every regular *.py directly in <extension>/scripts is executed as a webui script.
    scripts = sorted(p.name for p in (clone / "scripts").iterdir() if p.is_file() and p.suffix.lower() == ".py")
    assert scripts == ["tokenmerge_webui.py"]
    assert not (clone / "install.py").exists()  # nothing to install: the script uses the clone's src/
    out = run_python(
        f"""
import importlib.util, types
shared = types.SimpleNamespace(opts=types.SimpleNamespace(add_option=lambda key, info: None), OptionInfo=lambda *a, **k: None)
modules = types.ModuleType("modules")
modules.shared = shared
modules.script_callbacks = types.SimpleNamespace(on_ui_settings=lambda callback: None)
modules.sd_models = types.SimpleNamespace(tomesd=None)
gradio = types.ModuleType("gradio")
sys.modules.update({{"modules": modules, "modules.shared": shared, "modules.script_callbacks": modules.script_callbacks,
                    "modules.sd_models": modules.sd_models, "gradio": gradio}})
path = {str(clone / "scripts" / "tokenmerge_webui.py")!r}
spec = importlib.util.spec_from_file_location("tokenmerge_webui.py", path)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
import tokenmerge
assert tokenmerge.__file__.startswith({str(clone)!r}), tokenmerge.__file__
print(type(modules.sd_models.tomesd).__name__)
""",
        cwd=tmp_path,
    )
    assert out.strip() == "WebuiTokenMerge"


def test_importing_tokenmerge_loads_no_front_end_and_no_tool():
    out = subprocess.run(
        [sys.executable, "-c", "import sys, tokenmerge; print(sorted(m for m in sys.modules if m.startswith('tokenmerge.')))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    loaded = eval(out)
    assert loaded and not [m for m in loaded if m.startswith(("tokenmerge.tools", "tokenmerge.integrations"))]
    assert (
        "diffusers"
        not in subprocess.run(
            [sys.executable, "-c", "import sys, tokenmerge; print(list(sys.modules))"], capture_output=True, text=True
        ).stdout
    )


def test_the_project_version_is_static_and_equals_the_packages():
    """ComfyUI's registry parser (comfy_config) reads ``[project] version``; a dynamic version reads as "1.0.0"."""
    from pathlib import Path

    import tomllib

    import tokenmerge

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert "version" not in project.get("dynamic", []) and project["version"] == tokenmerge.__version__
