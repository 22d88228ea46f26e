"""Issue 42: the bench PNG's title carries the size (the size knob, GB per bind) and the
backend, and on sim a note that the effect comes from sim's copy-engine model."""
from pinstage import plot


def doc(backend):
    return {"benchmark": "pinstage bench qwen3-decode",
            "config": {"backend": backend, "layers": 2, "layers_automatic": False,
                       "layers_reason": "given", "reference_arm": "pageable"},
            "sizes": {"input_bytes": 2_042_999_952},
            "groups": [{}, {}, {}],
            "summary": {"arms": [{"arm": "pinned", "verdict": "42.2% slower",
                                  "groups_agreeing": 2}]}}


def test_the_title_names_backend_size_and_on_sim_the_model():
    title = plot._title(doc("sim"))
    first = title.splitlines()[0]
    assert first == "pinstage bench qwen3-decode on sim: 2 layers, 2.04 GB per bind"
    assert "pinned: 42.2% slower (2 of 3 groups agree)" in title
    assert "sim's copy-engine model" in title.splitlines()[-1]


def test_no_sim_note_on_a_device():
    title = plot._title(doc("cuda"))
    assert title.splitlines()[0].startswith("pinstage bench qwen3-decode on cuda: 2 layers")
    assert "copy-engine model" not in title
