"""The pipeline's Spark logic, as pure functions from DataFrames to DataFrames.

Nothing here knows about Celery, SQS or files: the tasks in ``app.py`` read and write
Parquet around these functions. That keeps the logic testable on a handful of rows
with PySpark in local mode, and lets the same functions run unchanged on a cluster.

The synthetic data is derived from hashes of row ids, not from ``rand()``, so a given
``(rows, seed)`` always yields the same data however Spark partitions it: a re-run,
or a duplicate execution, produces identical output.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

REGIONS: tuple[str, ...] = (
    "north-america",
    "europe",
    "asia-pacific",
    "south-america",
    "middle-east",
    "africa",
)
#: Relative share of customers per region, in the order of ``REGIONS``.
REGION_WEIGHTS: tuple[float, ...] = (0.34, 0.28, 0.22, 0.08, 0.05, 0.03)

CATEGORIES: tuple[str, ...] = (
    "electronics",
    "home",
    "grocery",
    "apparel",
    "sports",
    "books",
    "beauty",
    "toys",
)
#: Typical unit price per category, in the order of ``CATEGORIES``.
CATEGORY_BASE_PRICE: tuple[float, ...] = (240.0, 85.0, 12.0, 45.0, 70.0, 18.0, 30.0, 35.0)

SEGMENTS: tuple[str, ...] = ("consumer", "small-business", "corporate")
SEGMENT_WEIGHTS: tuple[float, ...] = (0.7, 0.2, 0.1)

CHANNELS: tuple[str, ...] = ("web", "mobile", "store", "marketplace")
CHANNEL_WEIGHTS: tuple[float, ...] = (0.45, 0.3, 0.15, 0.1)

STATUSES: tuple[str, ...] = ("completed", "cancelled", "returned")
STATUS_WEIGHTS: tuple[float, ...] = (0.9, 0.06, 0.04)

DISCOUNTS: tuple[float, ...] = (0.0, 0.05, 0.1, 0.2)
DISCOUNT_WEIGHTS: tuple[float, ...] = (0.7, 0.15, 0.1, 0.05)

#: Statuses whose revenue counts; cancelled orders were never paid.
REVENUE_STATUSES: tuple[str, ...] = ("completed",)

#: Customer value tiers by paid revenue: (name, lower bound), highest first.
VALUE_TIERS: tuple[tuple[str, float], ...] = (
    ("gold", 5_000.0),
    ("silver", 1_000.0),
    ("bronze", 0.0),
)

DEFAULT_START = dt.date(2024, 1, 1)
DEFAULT_DAYS = 90

# Shares of deliberately dirty rows, so the cleaning step has real work to do.
DUPLICATE_SHARE = 0.01
MISSING_CUSTOMER_SHARE = 0.005
BAD_QUANTITY_SHARE = 0.003


def _unit(key: Column, seed: int, salt: int) -> Column:
    """A uniform number in [0, 1) that depends only on ``key``, ``seed`` and ``salt``.

    Each column uses its own salt, so columns are independent of each other.
    """
    return F.pmod(F.xxhash64(key, F.lit(seed), F.lit(salt)), F.lit(1_000_003)) / F.lit(1_000_003.0)


def _pick(u: Column, values: Sequence[object], weights: Sequence[float]) -> Column:
    """Map a uniform number onto ``values`` with the given relative ``weights``."""
    total = float(sum(weights))
    bound = 0.0
    expr: Column | None = None
    for index, value in enumerate(values[:-1]):
        bound += weights[index] / total
        expr = F.when(u < bound, F.lit(value)) if expr is None else expr.when(u < bound, value)
    last = F.lit(values[-1])
    return last if expr is None else expr.otherwise(last)


def customer_count(rows: int) -> int:
    """How many customers a data set of ``rows`` orders has: about 25 orders each."""
    return max(20, rows // 25)


def product_count(rows: int) -> int:
    """How many products a data set of ``rows`` orders has: a catalogue, not a SKU per order."""
    return max(16, min(2_000, rows // 500))


def generate_customers(spark: SparkSession, count: int, seed: int) -> DataFrame:
    """The customer dimension: id, home region, segment and signup date."""
    key = F.col("id")
    return spark.range(count).select(
        key.alias("customer_id"),
        _pick(_unit(key, seed, 11), REGIONS, REGION_WEIGHTS).alias("region"),
        _pick(_unit(key, seed, 12), SEGMENTS, SEGMENT_WEIGHTS).alias("segment"),
        F.date_sub(F.lit(DEFAULT_START), (_unit(key, seed, 13) * 1_000).cast("int")).alias(
            "signup_date"
        ),
    )


def generate_products(spark: SparkSession, count: int, seed: int) -> DataFrame:
    """The product catalogue: id, name, category and list price.

    Prices spread around their category's base price, so revenue rankings differ
    from unit rankings, as in real sales data.
    """
    key = F.col("id")
    category_index = (_unit(key, seed, 21) * len(CATEGORIES)).cast("int")
    base_price = F.element_at(F.array(*[F.lit(p) for p in CATEGORY_BASE_PRICE]), category_index + 1)
    return spark.range(count).select(
        key.alias("product_id"),
        F.element_at(F.array(*[F.lit(c) for c in CATEGORIES]), category_index + 1).alias(
            "category"
        ),
        F.concat(F.lit("P-"), F.lpad(key.cast("string"), 5, "0")).alias("product_name"),
        F.round(base_price * (F.lit(0.4) + _unit(key, seed, 22) * 1.6), 2).alias("list_price"),
    )


def generate_orders(
    spark: SparkSession,
    rows: int,
    seed: int,
    customers: int,
    products: int,
    start: dt.date = DEFAULT_START,
    days: int = DEFAULT_DAYS,
) -> DataFrame:
    """Raw orders as an upstream system would export them, dirt included.

    Customers and products are skewed (a few buy, or sell, far more than the rest),
    orders cluster in the evening, and a small share of rows is dirty: exact
    duplicates (an upstream retry), a missing customer, a non-positive quantity, and
    the shipping region spelt with stray case and spaces.
    """
    row = F.col("id")
    # A duplicate row reuses the previous row's key, and every column below derives
    # from the key, so it is an exact copy of that order.
    key = F.when(_unit(row, seed, 31) < DUPLICATE_SHARE, F.greatest(row - 1, F.lit(0))).otherwise(
        row
    )
    day = (_unit(key, seed, 32) * days).cast("int")
    # Squaring a uniform number skews it towards 0: evening hours when mirrored.
    hour_of_day = F.lit(23.99) - F.pow(_unit(key, seed, 33), 2) * 16
    seconds = day * 86_400 + (hour_of_day * 3_600).cast("long")
    ordered_at = F.timestamp_seconds(
        F.unix_timestamp(F.lit(start.isoformat()), "yyyy-MM-dd") + seconds
    )
    customer_id = (F.pow(_unit(key, seed, 34), 2) * customers).cast("long")
    product_id = (F.pow(_unit(key, seed, 35), 2) * products).cast("long")
    quantity = (F.lit(1) + F.pow(_unit(key, seed, 36), 3) * 6).cast("int")
    region = _pick(_unit(customer_id, seed, 11), REGIONS, REGION_WEIGHTS)
    messy_region = _pick(
        _unit(key, seed, 37),
        ("clean", "upper", "padded"),
        (0.9, 0.05, 0.05),
    )
    return spark.range(rows).select(
        key.alias("order_id"),
        F.when(_unit(key, seed, 38) < MISSING_CUSTOMER_SHARE, F.lit(None).cast("long"))
        .otherwise(customer_id)
        .alias("customer_id"),
        product_id.alias("product_id"),
        F.when(_unit(key, seed, 39) < BAD_QUANTITY_SHARE, -quantity + 1)
        .otherwise(quantity)
        .alias("quantity"),
        _pick(_unit(key, seed, 40), DISCOUNTS, DISCOUNT_WEIGHTS).alias("discount"),
        _pick(_unit(key, seed, 41), CHANNELS, CHANNEL_WEIGHTS).alias("channel"),
        _pick(_unit(key, seed, 42), STATUSES, STATUS_WEIGHTS).alias("status"),
        F.when(messy_region == "upper", F.upper(region))
        .when(messy_region == "padded", F.concat(F.lit(" "), region, F.lit(" ")))
        .otherwise(region)
        .alias("ship_region"),
        ordered_at.alias("ordered_at"),
    )


def clean_orders(orders: DataFrame, customers: DataFrame, products: DataFrame) -> DataFrame:
    """Deduplicate, validate and enrich raw orders into one row per valid order.

    Drops exact re-sent duplicates, orders without a customer or with a quantity
    below one, and orders for unknown products or customers; normalises the shipping
    region; adds the customer's segment, the product's category and the revenue
    after discount.
    """
    valid = (
        orders.dropDuplicates(["order_id"])
        .where(F.col("customer_id").isNotNull() & (F.col("quantity") >= 1))
        .withColumn("ship_region", F.lower(F.trim(F.col("ship_region"))))
    )
    enriched = valid.join(F.broadcast(products), "product_id").join(
        customers.select("customer_id", "segment"), "customer_id"
    )
    return enriched.select(
        "order_id",
        "customer_id",
        "segment",
        "product_id",
        "product_name",
        "category",
        F.col("ship_region").alias("region"),
        "channel",
        "status",
        "quantity",
        "discount",
        "list_price",
        F.round(F.col("list_price") * F.col("quantity") * (1 - F.col("discount")), 2).alias(
            "revenue"
        ),
        "ordered_at",
        F.to_date("ordered_at").alias("order_date"),
    )


def daily_region_revenue(clean: DataFrame) -> DataFrame:
    """Revenue, orders, units and customers per day and region, paid orders only."""
    paid = clean.where(F.col("status").isin(*REVENUE_STATUSES))
    return (
        paid.groupBy("order_date", "region")
        .agg(
            F.count("*").alias("orders"),
            F.sum("quantity").alias("units"),
            F.round(F.sum("revenue"), 2).alias("revenue"),
            F.countDistinct("customer_id").alias("customers"),
        )
        .withColumn("avg_order_value", F.round(F.col("revenue") / F.col("orders"), 2))
        .orderBy("order_date", "region")
    )


def top_products(clean: DataFrame, per_region: int = 10) -> DataFrame:
    """The ``per_region`` products with the highest paid revenue in each region.

    Ties are broken by product id, so the ranking is deterministic.
    """
    paid = clean.where(F.col("status").isin(*REVENUE_STATUSES))
    totals = paid.groupBy("region", "product_id", "product_name", "category").agg(
        F.round(F.sum("revenue"), 2).alias("revenue"),
        F.sum("quantity").alias("units"),
    )
    ranking = Window.partitionBy("region").orderBy(F.desc("revenue"), F.asc("product_id"))
    return (
        totals.withColumn("rank", F.row_number().over(ranking))
        .where(F.col("rank") <= per_region)
        .orderBy("region", "rank")
    )


def customer_summary(clean: DataFrame) -> DataFrame:
    """One row per customer: paid orders, revenue, first and last order, and a value tier.

    Tiers use fixed revenue bounds rather than quantiles, which would need a global
    sort of every customer.
    """
    paid = clean.where(F.col("status").isin(*REVENUE_STATUSES))
    summary = paid.groupBy("customer_id", "segment", "region").agg(
        F.count("*").alias("orders"),
        F.round(F.sum("revenue"), 2).alias("revenue"),
        F.min("order_date").alias("first_order"),
        F.max("order_date").alias("last_order"),
        F.countDistinct("category").alias("categories"),
    )
    return summary.withColumn(
        "tier",
        F.when(F.col("revenue") >= VALUE_TIERS[0][1], VALUE_TIERS[0][0])
        .when(F.col("revenue") >= VALUE_TIERS[1][1], VALUE_TIERS[1][0])
        .otherwise(VALUE_TIERS[2][0]),
    )
