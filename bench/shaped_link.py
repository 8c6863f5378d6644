"""The shaped links of bench/simulated_pods, shared with bench/alpha_beta_model.py, which must
model the same token bucket the benchmark configured."""


def rate_bits(rate):
    """tc's rate ("1gbit", "500mbit", "100kbit") in bits per second."""
    for unit, factor in (("kbit", 1e3), ("mbit", 1e6), ("gbit", 1e9)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"rate {rate} needs a unit (kbit, mbit, gbit)")


def bucket_bytes(rate):
    """tbf's bucket: 0.25 ms at the rate (31 KB at 1 Gbit/s), at least 16 KiB. A larger bucket,
    refilled while the ranks sit in a barrier, lets a whole op of a few hundred KiB pass at
    memory speed (1 MiB measured 126 % of a 1 Gbit/s link with a 1 MiB bucket). tbf segments a
    GSO packet larger than its bucket, so this does not drop them."""
    return max(16 << 10, int(rate_bits(rate) / 8 * 0.00025))
