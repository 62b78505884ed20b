"""The learning curves of `make bench-rl` (benchmarks/rl_plots.py): drawn from
the committed rl_jobs.json alone, the same every time, one colour per backend,
on a range that shows the learning."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
import matplotlib

from benchmarks import rl_plots

# No bridged call: `make test` runs it in the native pass only.
pytestmark = pytest.mark.one_pass

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def data():
  return json.loads((RESULTS / "rl_jobs.json").read_text())


def _lines(ax, lw):
  return [line for line in ax.get_lines() if line.get_linewidth() == lw and len(line.get_xdata())]


def _thick(ax):
  return _lines(ax, 2.6)


def _thin(ax):
  return _lines(ax, 0.9)


def test_the_committed_pictures_are_what_the_committed_results_draw(data, tmp_path):
  # Twice from the same file: the same bytes. And the committed pictures are
  # that drawing, where they were drawn by this matplotlib (PNG's Software
  # field says which; another version may place a pixel differently).
  first = rl_plots.write(data, str(tmp_path / "a"))
  second = rl_plots.write(data, str(tmp_path / "b"))
  assert [Path(p).name for p in first] == ["rl_jobs_td3.png", "rl_jobs_ppo.png"]
  for a, b in zip(first, second):
    assert Path(a).read_bytes() == Path(b).read_bytes()
  for drawn in first:
    committed = RESULTS / Path(drawn).name
    assert committed.is_file(), f"{committed} is missing: python -m benchmarks.rl_jobs plot"
    with Image.open(committed) as image:
      software = image.info.get("Software", "")
    if f"version{matplotlib.__version__}," in software:
      assert committed.read_bytes() == Path(drawn).read_bytes(), (
        f"{committed.name} is not what rl_jobs.json draws: python -m benchmarks.rl_jobs plot"
      )


def test_td3_one_colour_per_backend_seeds_thin_means_thick(data):
  fig = rl_plots.td3_figure(data)
  whole, end = fig.axes
  curves = rl_plots.curves(data, "td3")
  with_curves = [b for b, per in curves.items() if per]
  assert with_curves == ["torchbridge", "pure torch", "Keras port"]
  assert curves["SB3 TD3"] == {}  # `learn()` evaluates only at the end
  colours = {b: rl_plots.colour(b) for b in curves}
  assert len(set(colours.values())) == len(colours)
  for ax in (whole, end):
    thick = _thick(ax)
    assert [line.get_color() for line in thick] == [colours[b] for b in with_curves]
    assert sorted(line.get_color() for line in _thin(ax)) == sorted(
      colours[b] for b in with_curves for _ in range(3)
    )
    # The mean is the mean over the seeds, evaluation by evaluation.
    for backend, line in zip(with_curves, thick):
      stacked = np.array([returns for _, returns in curves[backend].values()])
      shown = np.asarray(line.get_ydata())
      np.testing.assert_allclose(shown, stacked.mean(axis=0)[-len(shown) :])
    # SB3's seeds: markers at the last step, in SB3's colour.
    sb3 = [line for line in ax.get_lines() if line.get_color() == colours["SB3 TD3"]]
    finals = sorted(rl_plots.finals(data, "td3")["SB3 TD3"].values())
    assert sorted(sb3[0].get_ydata()) == pytest.approx(finals)
  legend = [t.get_text() for t in fig.legends[0].get_texts()]
  assert [text.split(":")[0] for text in legend] == list(curves)
  assert "environment steps" in whole.get_xlabel() and "thousands" in whole.get_xlabel()
  assert "return" in whole.get_ylabel()
  title = fig._suptitle.get_text()  # pylint: disable=protected-access
  assert "seeds 0, 1, 2" in title and "20,000 environment steps each\n" in title


def test_td3_range_shows_the_rise_and_the_end(data):
  whole, end = rl_plots.td3_figure(data).axes
  low, high = whole.get_ylim()
  # The random-action phase (about -1300) and the learned policy (about -100).
  assert low < -1400 and high > -100
  returns = [r for per in rl_plots.finals(data, "td3").values() for r in per.values()]
  low, high = end.get_ylim()
  assert low < min(returns) and max(returns) < high
  # The zoom spreads the last evaluations over the panel: the spread between
  # seeds is at least half of its height, not lost in the -1300 to 0 span.
  assert max(returns) - min(returns) > 0.5 * (high - low)


def test_ppo_one_panel_every_backend_evaluated(data):
  fig = rl_plots.ppo_figure(data)
  (ax,) = fig.axes
  curves = rl_plots.curves(data, "ppo")
  assert list(curves) == ["torchbridge", "pure torch", "SB3-contrib RecurrentPPO"]
  assert [line.get_color() for line in _thick(ax)] == [rl_plots.colour(b) for b in curves]
  assert len(_thin(ax)) == 3 * len(curves)
  assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] > rl_plots.PPO_MAX
  title = fig._suptitle.get_text()  # pylint: disable=protected-access
  assert "seeds 0, 1, 2" in title and "every 5,120 steps" in title
  # The budget the tables give, and where the last evaluation fell past it
  # (the end of the rollout that reached it).
  last = max(int(s) for per in curves.values() for steps, _ in per.values() for s in steps)
  assert last == 150_016
  assert "150,000 environment steps each (the last evaluation at 150,016)" in title


def test_the_titles_budgets_are_the_jobs(tmp_path):
  # rl_plots.BUDGETS is what rl_jobs passes each example as --steps (SB3's
  # runs take their own default, the same budget: sb3_process.py).
  from benchmarks import rl_jobs  # pylint: disable=import-outside-toplevel

  for job, budget in rl_plots.BUDGETS.items():
    examples = 0
    for run in rl_jobs._runs(job, 0, str(tmp_path)).values():  # pylint: disable=protected-access
      (args,) = run.__defaults__
      if "--steps" in args:
        assert args[args.index("--steps") + 1] == str(budget), (job, args)
        examples += 1
    assert examples >= 2, job


def test_a_smoke_run_draws_too(tmp_path):
  # rl_jobs --tiny's shape: a few evaluations, SB3's TD3 without a curve.
  def run(evals, final):
    return {"eval_returns": evals, "final_return": final}

  tiny = {
    "tiny": True,
    "runs": {
      "td3": {
        "0": {
          "torchbridge": run([[200, -1500.0], [400, -1400.0], [600, -1300.0]], -1300.0),
          "SB3 TD3": {"final_return": -1250.0},
        }
      },
      "ppo": {"0": {"torchbridge": run([[512, 20.0], [1024, 30.0]], 30.0)}},
    },
  }
  written = rl_plots.write(tiny, str(tmp_path))
  assert [Path(p).name for p in written] == ["rl_jobs_td3.png", "rl_jobs_ppo.png"]


def test_rl_jobs_plot_draws_from_the_results_file(tmp_path):
  out = subprocess.run(
    [sys.executable, "-m", "benchmarks.rl_jobs", "plot", "--out", str(tmp_path)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    check=False,
    timeout=120,
  )
  assert out.returncode == 0, out.stderr
  assert sorted(p.name for p in tmp_path.iterdir()) == ["rl_jobs_ppo.png", "rl_jobs_td3.png"]
