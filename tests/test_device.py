import doctest

import pytest
from pydantic import ValidationError

import kdispatch.device as device_mod
from kdispatch import Device
from kdispatch.device import INTERPRETER_KEY, family_key


def test_doctests():
    assert doctest.testmod(device_mod).failed == 0


@pytest.mark.parametrize("name,vendor,key", [
    ("NVIDIA H200", "nvidia", "nvidia-h200"),
    ("NVIDIA H200 NVL", "nvidia", "nvidia-h200-nvl"),
    ("NVIDIA H100 80GB HBM3", "nvidia", "nvidia-h100"),
    ("NVIDIA H100 PCIe", "nvidia", "nvidia-h100-pcie"),
    ("NVIDIA GeForce RTX 5090", "nvidia", "nvidia-rtx-5090"),
    ("AMD Instinct MI355X", "amd", "amd-mi355x"),
    ("AMD Instinct MI300X", "amd", "amd-mi300x"),
])
def test_family_key_normalization(name, vendor, key):
    assert family_key(name, vendor) == key


def test_nvl_and_sxm_do_not_collide():
    assert family_key("NVIDIA H200", "nvidia") != family_key("NVIDIA H200 NVL", "nvidia")


@pytest.mark.parametrize("key,arch,cu", [
    ("nvidia-h200", "sm_90", 132), ("nvidia-h100", "sm_90", 132),
    ("amd-mi300x", "gfx942", 304), ("amd-mi355x", "gfx950", 256),
    ("nvidia-rtx-5090", "sm_120", 170),
])
def test_from_key_builtin_records(key, arch, cu):
    d = Device.from_key(key)
    assert (d.key, d.arch, d.cu_count) == (key, arch, cu)


def test_from_key_unknown_names_the_argument():
    with pytest.raises(ValueError, match="device: unknown device key 'nvidia-h999'"):
        Device.from_key("nvidia-h999")


def test_cu_override(monkeypatch):
    monkeypatch.setenv("KDISPATCH_CU_NUM", "80")
    assert Device.from_key("amd-mi355x").cu_count == 80
    assert Device.interpreter().cu_count == 80
    monkeypatch.setenv("KDISPATCH_CU_NUM", "lots")
    with pytest.raises(ValueError, match="KDISPATCH_CU_NUM"):
        Device.from_key("amd-mi355x")
    monkeypatch.setenv("KDISPATCH_CU_NUM", "0")
    with pytest.raises(ValueError, match="outside"):
        Device.from_key("amd-mi355x")


def test_interpreter_device_is_its_own_key():
    d = Device.from_torch("cpu")
    assert d.key == INTERPRETER_KEY and d.is_interpreter and d.arch == "interpreter"
    assert Device.from_key(INTERPRETER_KEY) == d
    assert all(not Device.from_key(k).is_interpreter for k in device_mod.builtin_keys())


def test_explicit_fields_are_validated():
    d = Device(key="nvidia-h200", vendor="nvidia", name="NVIDIA H200", arch="sm_90", cu_count=132)
    assert d == Device.from_key("nvidia-h200")
    with pytest.raises(ValidationError):
        Device(key="NVIDIA H200", vendor="nvidia", name="x", arch="sm_90", cu_count=1)
    with pytest.raises(ValidationError):
        Device(key="nvidia-x", vendor="nvidia", name="x", arch="sm_90", cu_count=0)
    with pytest.raises(ValidationError):
        Device(key="nvidia-x", vendor="nvidia", name="x", arch="hopper", cu_count=1)
    with pytest.raises(ValidationError):
        d.cu_count = 3  # frozen


def test_from_torch_rejects_other_device_types():
    with pytest.raises(ValueError, match="device: unsupported"):
        Device.from_torch("meta")


def test_from_key_prefers_shipped_table_record(tmp_path, monkeypatch):
    rec = Device(key="nvidia-h200", vendor="nvidia", name="NVIDIA H200", arch="sm_90",
                 cu_count=132).model_dump()
    rec["cu_count"] = 128  # a table tuned on a partitioned part
    (tmp_path / "nvidia-h200.json").write_text(
        '{"format_version": 1, "device": %s, "entries": []}' % __import__("json").dumps(rec))
    monkeypatch.setenv("KDISPATCH_TABLE_DIR", str(tmp_path))
    assert Device.from_key("nvidia-h200").cu_count == 128
