"""A grouped request (list[Req]) decodes its observation once, not once per member.

The members of an expand_request_outputs group share one image_path object (sglang copies the Req
shallowly, so the pickle memo makes it one object here). Members whose image_path was another object were
each decoded in full to be compared with the first: a few hundred bytes of path strings naming one large
image ('/d/x.png', '/d/./x.png', '/d//x.png', ...) made one small request cost up to 256 full image decodes
in the bridge's planning threads. Sources are now compared as sent, without decoding."""

from __future__ import annotations

import io

import pytest

from candidate_scheduler.compat import images as images_mod
from candidate_scheduler.compat.classify import classify
from candidate_scheduler.compat.errors import CompatError
from candidate_scheduler.compat.mapping import plan_generation
from tests.unit.test_sglang_compat import _image, _pil_state, load, req


@pytest.fixture
def decodes(monkeypatch):
    calls = []
    real = images_mod.image_to_rgb_array

    def counting(image):
        calls.append(type(image).__name__)
        return real(image)

    monkeypatch.setattr(images_mod, "image_to_rgb_array", counting)
    return calls


def _member(i, image_path):
    return req(sp={"seed": 10 + i, "request_id": f"p:{i}", "image_path": image_path},
               extra={"parent_request_id": "p", "output_index": i})


def test_path_spellings_of_one_image_are_not_each_decoded(tmp_path, decodes):
    from PIL import Image

    d = tmp_path / "d"
    d.mkdir()
    Image.fromarray(_image()).save(d / "x.png")
    spellings = [str(d / "x.png"), f"{d}/./x.png", f"{d}//x.png", f"{d}/../d/x.png", f"{d}/././x.png"]
    try:
        plan_generation(classify(load([_member(i, p) for i, p in enumerate(spellings)])).reqs)
    except CompatError:
        pass  # refusing the group is fine; decoding every member to find out is not
    assert len(decodes) <= 1, f"{len(decodes)} decodes for one grouped request"


def test_encoded_bytes_of_one_image_are_decoded_once(decodes):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(_image()).save(buf, format="PNG")
    png = buf.getvalue()
    # equal bytes, but separate objects in the pickle (no memo sharing)
    plan = plan_generation(classify(load([_member(i, bytes(bytearray(png))) for i in range(4)])).reqs)
    assert plan.kind == "outputs" and plan.submit.candidates.count == 4
    assert len(decodes) == 1


def test_equal_pil_images_sent_separately_still_group(decodes):
    plan = plan_generation(classify(load([_member(i, _pil_state(_image())) for i in range(3)])).reqs)
    assert plan.kind == "outputs" and plan.submit.candidates.count == 3
    assert len(decodes) == 1


@pytest.mark.parametrize("other", [_pil_state(_image(1)), _image(0)[:, :, ::-1].copy()],
                         ids=["other_pixels", "array"])
def test_a_member_with_another_observation_is_refused(other):
    with pytest.raises(CompatError, match="share one observation"):
        plan_generation(classify(load([_member(0, _pil_state(_image())), _member(1, other)])).reqs)


def test_same_exif_matters(decodes):
    a = _pil_state(_image())
    b = _pil_state(_image())
    b.state[0] = {"exif": b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\x00\x01\x01\x12\x00\x03\x00\x00\x00\x01\x00\x06\x00\x00"}
    with pytest.raises(CompatError, match="share one observation"):  # orientation 6: the pixels differ once read
        plan_generation(classify(load([_member(0, a), _member(1, b)])).reqs)


def test_a_stateless_pil_member_is_the_clients_error():
    from candidate_scheduler.compat.foreign import ForeignObject

    bare = ForeignObject("PIL.Image", "Image")  # NEWOBJ without BUILD: a stub with no fields
    with pytest.raises(CompatError):
        plan_generation(classify(load([_member(0, _pil_state(_image())), _member(1, bare)])).reqs)
