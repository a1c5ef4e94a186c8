"""The host price from AWS's Price List API (`gradshare.cost.prices`), through botocore's Stubber
(never an account): one clear price is taken; none, two or an error leave the declared price, with
a warning. (The guard, prepare's refresh and S3 against a moto server: tests/e2e/test_aws.py.)"""
from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from gradshare.contract.plan import load_plan
from gradshare.cost import prices


def _product(usd: str) -> str:
    return json.dumps({"product": {"attributes": {"instanceType": "g6e.2xlarge"}},
                       "terms": {"OnDemand": {"X.JRTCKXETXF": {"priceDimensions": {"X.JRTCKXETXF.6YS6EN2CT7": {
                           "unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}}})



def test_the_price_is_read_from_the_price_list_api_response():
    plan = load_plan("full", {})
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    with Stubber(client) as stub:
        stub.add_response("get_products", {"PriceList": [_product("2.45160")], "FormatVersion": "aws_v1"},
                          {"ServiceCode": "AmazonEC2", "Filters": prices._filters("g6e.2xlarge", "us-east-1"),
                           "MaxResults": 10})
        usd, date, warning = prices.refreshed_price(plan, client)
    assert (usd, warning) == (2.4516, None) and date != plan.infra.price_date



@pytest.mark.parametrize("answer", [[], [_product("2.4"), _product("3.1")], "error"])
def test_without_one_clear_price_the_declared_one_stands_with_a_warning(answer):
    plan = load_plan("full", {})
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    with Stubber(client) as stub:
        if answer == "error":
            stub.add_client_error("get_products", "AccessDeniedException", "not authorised")
        else:
            stub.add_response("get_products", {"PriceList": answer, "FormatVersion": "aws_v1"})
        usd, date, warning = prices.refreshed_price(plan, client)
    assert (usd, date) == (plan.infra.usd_per_host_hour, plan.infra.price_date)
    assert "price not refreshed" in warning and f"${plan.infra.usd_per_host_hour}/h" in warning
