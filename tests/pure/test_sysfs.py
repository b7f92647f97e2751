"""Kernel sensors without I/O (drivers.sysfs): from a directory's names to the files a reading
is made of, and from those files' texts (or the errno of their read) to a reading in °C, %RH
and hPa or the fault that is the device's status reason. The texts are the ones the kernel's
ABI documents and drivers give: sysfs-class-hwmon (temp1_input in m°C, humidity1_input in
m%RH), sysfs-bus-iio (in_<type>_input, or (raw + offset) x scale; temperature m°C, humidity
m%RH, pressure kPa), sysfs-driver-w1_therm (temperature in m°C, w1_slave's crc and t= lines)."""

from __future__ import annotations

import errno
import tomllib

import pytest

from cairn.drivers import serial_config
from cairn.drivers.sysfs import (
    HWMON,
    IIO,
    W1,
    Errno,
    Fault,
    Found,
    Plan,
    Text,
    i2c_address,
    new_device_fault,
    new_device_line,
    plan,
    reading,
    scan_entry,
    sensor_id,
)

SHT3X = {"name": "sht3x\n", "temp1_input": "22475\n", "humidity1_input": "41325\n",
         "update_interval": "0\n", "heater_enable": "0\n"}
BME280 = {"name": "bme280\n", "in_temp_input": "21530\n",
          "in_humidityrelative_input": "48312\n", "in_pressure_input": "92.947000000\n",
          "in_temp_oversampling_ratio": "2\n", "in_pressure_oversampling_ratio": "16\n"}
# the hdc100x driver: raw counts, (raw + offset) x scale in m°C and m%RH
HDC1000 = {"name": "hdc1000\n", "in_temp_raw": "26000\n", "in_temp_offset": "-15887.515151\n",
           "in_temp_scale": "2.517700195\n", "in_humidityrelative_raw": "31457\n",
           "in_humidityrelative_scale": "1.525878906\n"}
W1_GOOD = ("72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n"
           "72 01 4b 46 7f ff 0e 10 57 t=23125\n")


def read(family, files: dict[str, Text], channels=None):
    """plan() from the directory's names, then reading() from the texts it asks for."""
    found = plan(family, channels, frozenset(files))
    return found if isinstance(found, Fault) else reading(found, files)


# --- hwmon ------------------------------------------------------------------------------------

def test_hwmon_temperature_and_humidity_are_read_in_millidegrees_and_millipercent():
    assert read(HWMON, SHT3X) == {"temperature": 22.475, "humidity": 41.325}


def test_a_hwmon_chip_without_humidity_reads_temperature_alone():
    lm75 = {"name": "tmp105\n", "temp1_input": "-5500\n", "temp1_max": "80000\n"}
    assert read(HWMON, lm75) == {"temperature": -5.5}


def test_configured_channels_name_the_fields():
    tmp421 = {"name": "tmp421\n", "temp1_input": "31000\n", "temp2_input": "45250\n"}
    assert read(HWMON, tmp421, {"board": "temp1", "remote": "temp2"}) == \
        {"board": 31.0, "remote": 45.25}


def test_a_configured_channel_the_chip_lacks_is_a_fault():
    fault = read(HWMON, SHT3X, {"temperature": "temp2"})
    assert fault.kind == "missing" and "temp2_input" in fault.reason


def test_a_directory_with_none_of_the_default_channels_is_a_fault():
    fault = read(HWMON, {"name": "gpio_fan\n", "fan1_input": "3000\n"})
    assert fault == Fault("missing", "none of temp1_input, humidity1_input")


# --- IIO --------------------------------------------------------------------------------------

def test_iio_processed_values_become_celsius_percent_and_hectopascal():
    assert read(IIO, BME280) == {"temperature": 21.53, "humidity": 48.312, "pressure": 929.47}


def test_iio_input_is_read_where_the_driver_gives_it_even_beside_raw():
    both = {"in_temp_input": "24738\n", "in_temp_raw": "9999\n", "in_temp_scale": "7\n"}
    found = plan(IIO, None, frozenset(both))
    assert found.files == ("in_temp_input",) and reading(found, both) == {"temperature": 24.738}


def test_iio_raw_is_offset_then_scaled():
    # (26000 - 15887.515151) x 2.517700195 = 25460.2 m°C; 31457 x 1.525878906 = 47999.6 m%RH
    assert read(IIO, HDC1000) == {"temperature": 25.46, "humidity": 48.0}


def test_iio_raw_without_scale_or_offset_is_in_the_kernel_unit():
    assert read(IIO, {"in_temp_raw": "21000\n"}) == {"temperature": 21.0}


def test_an_indexed_channel_takes_the_scale_and_offset_shared_by_its_type():
    files = {"in_temp0_raw": "100\n", "in_temp_scale": "250\n", "in_temp_offset": "-4\n"}
    assert read(IIO, files, {"temperature": "in_temp0"}) == {"temperature": 24.0}


def test_a_channel_s_own_scale_is_used_before_the_shared_one():
    files = {"in_temp0_raw": "100\n", "in_temp0_scale": "100\n", "in_temp_scale": "250\n"}
    assert plan(IIO, {"t": "in_temp0"}, frozenset(files)).files == \
        ("in_temp0_raw", "in_temp0_scale")


def test_a_modified_iio_channel_is_read_by_its_full_name():
    mlx90614 = {"in_temp_ambient_raw": "14800\n", "in_temp_scale": "20\n",
                "in_temp_offset": "-13657.5\n", "in_temp_object_raw": "15000\n"}
    assert read(IIO, mlx90614, {"ambient": "in_temp_ambient"}) == {"ambient": 22.85}


# --- 1-Wire -----------------------------------------------------------------------------------

def test_w1_temperature_is_read_in_millidegrees():
    assert read(W1, {"temperature": "-10125\n", "w1_slave": W1_GOOD}) == \
        {"temperature": -10.125}


def test_w1_slave_is_read_where_the_kernel_has_no_temperature_file():
    assert read(W1, {"w1_slave": W1_GOOD, "name": "28-0316a2790b6f\n"}) == \
        {"temperature": 23.125}


def test_w1_slave_with_crc_no_is_a_fault_not_its_repeated_last_value():
    bad = W1_GOOD.replace("crc=57 YES", "crc=57 NO")
    assert read(W1, {"w1_slave": bad}).kind == "crc"


@pytest.mark.parametrize("files", [{"temperature": "85000\n"},
                                   {"w1_slave": W1_GOOD.replace("t=23125", "t=85000")}],
                         ids=["temperature", "w1_slave"])
def test_85_degrees_from_a_ds18b20_is_its_power_on_value_not_a_reading(files):
    fault = read(W1, files)
    assert fault.kind == "power_on" and "power-on" in fault.reason


def test_an_empty_temperature_means_no_value_yet():
    # a bulk read was triggered and has not finished: the file reads empty
    assert read(W1, {"temperature": ""}).kind == "empty"


def test_w1_slave_that_is_not_two_lines_of_crc_and_t_is_garbage():
    assert read(W1, {"w1_slave": "ff ff ff\n"}).kind == "garbage"


def test_a_1_wire_directory_without_either_file_is_a_fault():
    assert read(W1, {"name": "28-0316a2790b6f\n"}) == \
        Fault("missing", "none of temperature, w1_slave")


# --- faults -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "words"), [
    (errno.EREMOTEIO, "did not answer"),      # i2c-bcm2835 on a NACK: the chip is not there
    (errno.ENXIO, "acknowledged"),            # an adapter that got no ACK for the address
    (errno.EIO, "checksum"),                  # a DHT11's checksum, an SHT3x's CRC
    (errno.ETIMEDOUT, "in time"),             # a DHT11 that does not answer its start
    (errno.ENODEV, "went away"),              # the device was unbound while open
])
def test_a_kernel_errno_is_a_fault_naming_the_file_the_errno_and_what_it_means(code, words):
    fault = read(HWMON, {**SHT3X, "temp1_input": Errno(code)})
    name = errno.errorcode[code]
    assert fault.kind == name
    assert fault.reason.startswith(f"temp1_input: {name}, ") and words in fault.reason


def test_an_errno_without_a_hint_is_named_alone():
    assert read(HWMON, {**SHT3X, "temp1_input": Errno(errno.EISDIR)}) == \
        Fault("EISDIR", "temp1_input: EISDIR")


@pytest.mark.parametrize("text", ["ERROR\n", "\x00\x01\x02", "22.5.1\n", "nan\n", "inf\n"])
def test_text_that_is_not_a_finite_number_is_garbage_quoting_it(text):
    fault = read(HWMON, {**SHT3X, "humidity1_input": text})
    assert fault.kind == "garbage" and repr(text.strip()[:24]) in fault.reason


def test_an_errno_from_a_scale_file_is_the_reading_s_fault():
    fault = read(IIO, {**HDC1000, "in_temp_scale": Errno(errno.EIO)})
    assert fault.kind == "EIO" and fault.reason.startswith("in_temp_scale:")


def test_a_fault_in_any_channel_costs_the_whole_reading():
    assert read(IIO, {**BME280, "in_pressure_input": Errno(errno.EREMOTEIO)}).kind == \
        "EREMOTEIO"


def test_a_plan_remembers_its_channels_so_a_later_find_needs_them_all():
    found = plan(HWMON, None, frozenset(SHT3X))
    assert isinstance(found, Plan)
    assert found.channels == {"temperature": "temp1", "humidity": "humidity1"}
    assert plan(HWMON, found.channels, frozenset({"temp1_input"})).kind == "missing"


# --- names ------------------------------------------------------------------------------------

def test_an_i2c_device_name_is_its_bus_and_hex_address():
    assert i2c_address("1-0076") == (1, 0x76) and i2c_address("10-0044") == (10, 0x44)
    assert i2c_address("dht11@0") is None and i2c_address("1-76") is None


def test_new_device_takes_the_chip_and_its_address_in_hex():
    assert new_device_line("bme280", 0x76) == "bme280 0x76\n"


def test_a_refused_new_device_write_says_what_to_do_instead():
    fault = new_device_fault("/sys/bus/i2c/devices/i2c-1/new_device", "bme280 0x76\n",
                             Errno(errno.EACCES))
    assert fault.kind == "new_device"
    assert "'bme280 0x76'" in fault.reason and "EACCES" in fault.reason
    assert "root" in fault.reason and "dtoverlay=i2c-sensor" in fault.reason


@pytest.mark.parametrize(("chip", "device", "expected"), [
    ("bme280", "1-0076", "bme280-1-0076"), ("DS18B20", "28-0316a2790b6f",
                                            "ds18b20-28-0316a2790b6f"),
    ("dht11", "dht11@0", "dht11_0")])
def test_a_scanned_device_s_id_is_one_topic_component(chip, device, expected):
    assert sensor_id(chip, device) == expected


# --- cairn sensor scan's entries --------------------------------------------------------------

def parse_entry(text: str) -> serial_config.SensorConfig:
    (sensor,) = serial_config.parse(tomllib.loads(text), "scan.toml").sensors
    return sensor


def test_a_scan_entry_is_a_sensors_entry_the_config_accepts():
    found = Found(IIO, "1-0076", "i2c", "bme280", "iio:device0",
                  {"in_temp": 21.53, "in_humidityrelative": 48.3, "in_pressure": 929.47})
    text = scan_entry(found)
    assert text.splitlines()[0] == ("# iio iio:device0: bme280 (1-0076 on i2c): in_temp 21.53 "
                                    "°C, in_humidityrelative 48.3 %RH, in_pressure 929.47 hPa")
    sensor = parse_entry(text)
    assert (sensor.id, sensor.kind, sensor.device, sensor.channels) == \
        ("bme280-1-0076", "iio", "1-0076", None)


def test_a_scan_entry_spells_out_channels_beyond_the_defaults():
    found = Found(HWMON, "0-004c", "i2c", "tmp421", "hwmon3", {"temp1": 31.0, "temp2": 45.25})
    assert parse_entry(scan_entry(found)).channels == {"temperature": "temp1", "temp2": "temp2"}


def test_a_scan_entry_of_another_sysfs_names_it():
    found = Found(W1, "28-0316a2790b6f", "w1", "DS18B20", "28-0316a2790b6f",
                  {"temperature": 21.0})
    assert parse_entry(scan_entry(found, "/tmp/sys")).sysfs == "/tmp/sys"


def test_a_device_without_a_stable_name_is_listed_but_not_offered():
    found = Found(HWMON, None, None, "cpu_thermal", "hwmon0", {"temp1": 48.3})
    text = scan_entry(found)
    assert "[[sensors]]" not in text and "not offered: no stable name" in text


def test_a_channel_that_reads_a_fault_is_shown_with_its_reason():
    found = Found(HWMON, "1-0044", "i2c", "sht3x", "hwmon2",
                  {"temp1": Fault("EREMOTEIO", "temp1_input: EREMOTEIO")})
    assert "temp1 (temp1_input: EREMOTEIO)" in scan_entry(found)
