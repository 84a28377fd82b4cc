"""LocalDeployment.build: the FAB Flower bundles, built once per app folder when given a cache."""

import sys
from pathlib import Path

from flwr_fedeval.testing import deployment as local


def test_a_fab_cache_builds_each_app_once_and_keeps_apps_apart(tmp_path, monkeypatch):
    builds = []
    real = local.build_fab

    def counted(app, python=None):
        builds.append(Path(app).resolve())
        return real(app, python)

    monkeypatch.setattr(local, "build_fab", counted)
    apps = []
    for name in ("one", "two"):
        app = tmp_path / name
        (app / "pkg").mkdir(parents=True)
        (app / "pkg" / "__init__.py").write_text("")
        (app / "pyproject.toml").write_text(
            f'[project]\nname = "{name}"\nversion = "1.0.0"\n'
            '[tool.flwr.app]\npublisher = "fedeval-test"\n'
            '[tool.flwr.app.components]\nserverapp = "pkg:server"\nclientapp = "pkg:client"\n')
        apps.append(app)
    cache: dict = {}
    bin_dir = Path(sys.executable).parent
    dep = local.LocalDeployment(tmp_path / "dep", bin_dir=bin_dir, tls=False, sign_fabs=False, fab_cache=cache)
    first = dep.build(apps[0])
    assert dep.build(apps[0]) is first and builds == [apps[0]]
    other = local.LocalDeployment(tmp_path / "dep2", bin_dir=bin_dir, tls=False, sign_fabs=False, fab_cache=cache)
    assert other.build(apps[0]) is first          # another deployment of the session: no rebuild
    second = other.build(apps[1])
    assert second.content != first.content and builds == [apps[0], apps[1]]
    uncached = local.LocalDeployment(tmp_path / "dep3", bin_dir=bin_dir, tls=False, sign_fabs=False)
    assert uncached.build(apps[0]).content == first.content and len(builds) == 3
