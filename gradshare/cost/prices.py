"""The study hosts' on-demand price from the AWS Price List API, or the plan's declared
figure with a warning when the API cannot be asked or gives no single answer.

    from gradshare.cost.prices import refreshed_price
    usd, date, note = refreshed_price(plan)          # note is None when the API answered

Used by prepare when the plan asks for it (`infra.refresh_prices=true`): the price the
plan then carries, and its date, are the API's; the prepare run records where it came
from (`price_source`). Credentials come only from boto3's standard chain and are never
logged; the Price List API is served from us-east-1 whatever the hosts' region.
"""
from __future__ import annotations

import datetime as dt
import json


PRICING_REGION = "us-east-1"


def _filters(instance_type: str, region: str) -> list[dict]:
    match = {"instanceType": instance_type, "regionCode": region, "operatingSystem": "Linux",
             "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in match.items()]


def on_demand_usd(client, instance_type: str, region: str) -> float:
    """The one on-demand USD price per hour the API lists for this instance, or ValueError."""
    resp = client.get_products(ServiceCode="AmazonEC2", Filters=_filters(instance_type, region), MaxResults=10)
    prices = set()
    for item in resp.get("PriceList", []):
        product = json.loads(item) if isinstance(item, str) else item
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dim in term.get("priceDimensions", {}).values():
                if dim.get("unit") in ("Hrs", "Hours") and "USD" in dim.get("pricePerUnit", {}):
                    prices.add(float(dim["pricePerUnit"]["USD"]))
    prices.discard(0.0)
    if len(prices) != 1:
        raise ValueError(f"the Price List API gave {len(prices)} on-demand prices for {instance_type} in "
                         f"{region} ({sorted(prices)}), not one")
    return prices.pop()


def refreshed_price(plan, client=None) -> tuple[float, str, str | None]:
    """(USD per host-hour, its date, a warning or None)."""
    i = plan.infra
    region = i.aws_region or (i.zones[0][:-1] if i.zones else PRICING_REGION)
    try:
        if client is None:
            import boto3

            client = boto3.client("pricing", region_name=PRICING_REGION)
        usd = on_demand_usd(client, i.instance_type, region)
        return usd, dt.date.today().isoformat(), None
    except Exception as exc:  # noqa: BLE001 - any failure falls back, and says so
        text = " ".join(str(exc).split())[:300]
        return (i.usd_per_host_hour, i.price_date,
                f"price not refreshed ({type(exc).__name__}: {text}); using the declared "
                f"${i.usd_per_host_hour}/h of {i.price_date}")
