"""The pipeline's Spark logic on tiny data, with PySpark in local mode."""

from __future__ import annotations

import datetime as dt

import pytest

pytest.importorskip("pyspark")

from pyspark.sql import DataFrame, SparkSession

from examples.spark_pipeline import transforms

pytestmark = pytest.mark.spark

ORDER_COLUMNS = (
    "order_id long, customer_id long, product_id long, quantity int, discount double, "
    "channel string, status string, ship_region string, ordered_at timestamp"
)


def _at(day: int, hour: int = 12) -> dt.datetime:
    # Time-zone aware: the session computes dates in UTC, whatever the machine's zone.
    return dt.datetime(2024, 1, day, hour, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def products(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [(1, "home", "P-00001", 10.0), (2, "books", "P-00002", 4.0), (3, "toys", "P-00003", 7.5)],
        "product_id long, category string, product_name string, list_price double",
    )


@pytest.fixture(scope="module")
def customers(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            (100, "europe", "consumer", dt.date(2023, 5, 1)),
            (200, "africa", "corporate", dt.date(2022, 1, 1)),
        ],
        "customer_id long, region string, segment string, signup_date date",
    )


@pytest.fixture(scope="module")
def raw_orders(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            (1, 100, 1, 2, 0.0, "web", "completed", "europe", _at(1)),
            (1, 100, 1, 2, 0.0, "web", "completed", "europe", _at(1)),  # re-sent duplicate
            (2, 100, 2, 1, 0.5, "store", "completed", " EUROPE ", _at(1, 20)),
            (3, 200, 1, 3, 0.1, "mobile", "completed", "Africa", _at(2)),
            (4, None, 1, 1, 0.0, "web", "completed", "europe", _at(2)),  # no customer
            (5, 200, 3, 0, 0.0, "web", "completed", "africa", _at(2)),  # quantity 0
            (6, 200, 3, 1, 0.0, "web", "cancelled", "africa", _at(2)),  # never paid
            (7, 100, 99, 1, 0.0, "web", "completed", "europe", _at(3)),  # unknown product
        ],
        ORDER_COLUMNS,
    )


@pytest.fixture(scope="module")
def clean(raw_orders: DataFrame, customers: DataFrame, products: DataFrame) -> DataFrame:
    return transforms.clean_orders(raw_orders, customers, products).cache()


def test_clean_orders_keeps_one_row_per_valid_order(clean: DataFrame) -> None:
    assert sorted(r.order_id for r in clean.collect()) == [1, 2, 3, 6]


def test_clean_orders_normalises_regions_and_computes_revenue(clean: DataFrame) -> None:
    rows = {r.order_id: r for r in clean.collect()}
    assert {r.region for r in rows.values()} == {"europe", "africa"}
    assert rows[1].revenue == 20.0
    assert rows[2].revenue == 2.0
    assert rows[3].revenue == 27.0
    assert rows[3].segment == "corporate"
    assert rows[3].category == "home"
    assert rows[2].order_date == dt.date(2024, 1, 1)


def test_daily_region_revenue_counts_paid_orders_only(clean: DataFrame) -> None:
    daily = [r.asDict() for r in transforms.daily_region_revenue(clean).collect()]
    assert daily == [
        {
            "order_date": dt.date(2024, 1, 1),
            "region": "europe",
            "orders": 2,
            "units": 3,
            "revenue": 22.0,
            "customers": 1,
            "avg_order_value": 11.0,
        },
        {
            "order_date": dt.date(2024, 1, 2),
            "region": "africa",
            "orders": 1,
            "units": 3,
            "revenue": 27.0,
            "customers": 1,
            "avg_order_value": 27.0,
        },
    ]


def test_top_products_ranks_by_revenue_within_each_region(clean: DataFrame) -> None:
    top = [
        (r.region, r.rank, r.product_id, r.revenue)
        for r in transforms.top_products(clean, per_region=1).collect()
    ]
    assert top == [("africa", 1, 1, 27.0), ("europe", 1, 1, 20.0)]


def test_top_products_breaks_ties_by_product_id(spark: SparkSession) -> None:
    clean = spark.createDataFrame(
        [
            (2, "P2", "toys", "europe", "completed", 1, 5.0),
            (1, "P1", "toys", "europe", "completed", 1, 5.0),
        ],
        "product_id long, product_name string, category string, region string, status string, "
        "quantity int, revenue double",
    )
    assert [r.product_id for r in transforms.top_products(clean).collect()] == [1, 2]


def test_customer_summary_assigns_value_tiers(spark: SparkSession) -> None:
    clean = spark.createDataFrame(
        [
            (1, "consumer", "europe", "home", "completed", 6000.0, dt.date(2024, 1, 1)),
            (2, "consumer", "europe", "home", "completed", 999.0, dt.date(2024, 1, 2)),
            (2, "consumer", "europe", "toys", "completed", 1.0, dt.date(2024, 1, 5)),
            (3, "consumer", "africa", "home", "cancelled", 9000.0, dt.date(2024, 1, 1)),
            (3, "consumer", "africa", "home", "completed", 10.0, dt.date(2024, 1, 1)),
        ],
        "customer_id long, segment string, region string, category string, status string, "
        "revenue double, order_date date",
    )
    rows = {r.customer_id: r for r in transforms.customer_summary(clean).collect()}
    assert (rows[1].tier, rows[2].tier, rows[3].tier) == ("gold", "silver", "bronze")
    assert (rows[2].orders, rows[2].categories) == (2, 2)
    assert (rows[2].first_order, rows[2].last_order) == (dt.date(2024, 1, 2), dt.date(2024, 1, 5))


def test_generated_data_does_not_depend_on_partitioning(spark: SparkSession) -> None:
    """Hash-derived columns: a re-run (or a duplicate run) writes identical data."""
    one = transforms.generate_orders(spark, 500, 3, 40, 16).collect()
    many = transforms.generate_orders(spark, 500, 3, 40, 16).repartition(7).collect()
    assert sorted(one) == sorted(many)
    other_seed = transforms.generate_orders(spark, 500, 4, 40, 16).collect()
    assert sorted(one) != sorted(other_seed)


def test_generated_orders_are_dirty_in_the_ways_cleaning_expects(spark: SparkSession) -> None:
    rows = 20_000
    customers = transforms.customer_count(rows)
    products = transforms.product_count(rows)
    orders = transforms.generate_orders(spark, rows, 7, customers, products).cache()
    assert orders.count() == rows
    assert orders.select("order_id").distinct().count() < rows  # duplicates
    assert orders.where("customer_id IS NULL").count() > 0
    assert orders.where("quantity < 1").count() > 0
    regions = {r.ship_region for r in orders.select("ship_region").distinct().collect()}
    assert {r.strip().lower() for r in regions} == set(transforms.REGIONS)
    assert regions != set(transforms.REGIONS)  # some are upper case or padded
    bounds = orders.selectExpr(
        "min(customer_id) lo_c",
        "max(customer_id) hi_c",
        "min(product_id) lo_p",
        "max(product_id) hi_p",
        "min(to_date(ordered_at)) first",
        "max(to_date(ordered_at)) last",
    ).first()
    assert bounds is not None
    assert bounds.lo_c >= 0 and bounds.hi_c < customers
    assert bounds.lo_p >= 0 and bounds.hi_p < products
    start = transforms.DEFAULT_START
    assert start <= bounds.first and bounds.last < start + dt.timedelta(
        days=transforms.DEFAULT_DAYS
    )


def test_generated_dimensions_join_every_clean_order(spark: SparkSession) -> None:
    rows = 5_000
    customers = transforms.customer_count(rows)
    products = transforms.product_count(rows)
    orders = transforms.generate_orders(spark, rows, 7, customers, products)
    clean = transforms.clean_orders(
        orders,
        transforms.generate_customers(spark, customers, 7),
        transforms.generate_products(spark, products, 7),
    )
    valid = orders.dropDuplicates(["order_id"]).where("customer_id IS NOT NULL AND quantity >= 1")
    assert clean.count() == valid.count()
    # The shipping region is the customer's home region, once normalised.
    mismatched = clean.join(
        transforms.generate_customers(spark, customers, 7).withColumnRenamed("region", "home"),
        "customer_id",
    ).where("region != home")
    assert mismatched.count() == 0
