"""Panel helpers over grafana-foundation-sdk (Grafana 11.6, schemaVersion 41).

Every panel gets the `${datasource}` variable as its data source, a unit, and where a
threshold exists in `zerodoc.thresholds`, that threshold (drawn as a line on time series).
Imported only when dashboards are generated (`python -m zerodoc.cli.dashboards_gen`).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, common as cb, dashboard as db
from grafana_foundation_sdk.builders import heatmap, prometheus, stat, table, timeseries
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Label selectors: every query is scoped by the dashboard variables.
SEL = 'job=~"$job", rank=~"$rank"'
SEL_UNIT = SEL + ', unit=~"$unit"'
RATE = "$__rate_interval"


# --------------------------------------------------------------------------------------
# variables


def variables() -> list:
    def labels_of(name: str, metric: str, label: str, **kw) -> db.QueryVariable:
        v = (db.QueryVariable(name).label(kw.get("title", name.capitalize()))
             .query(f"label_values({metric}, {label})").datasource(DS)
             .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
             .multi(True).include_all(True).all_value(kw.get("all", ".*"))
             .current(dm.VariableOption(selected=True, text="All", value="$__all")))
        if kw.get("numeric"):
            v = v.sort(dm.VariableSort.NUMERICAL_ASC)
        else:
            v = v.sort(dm.VariableSort.ALPHABETICAL_ASC)
        return v.description(kw["help"])

    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus")
        .description("The Prometheus that scrapes the training ranks."),
        labels_of("job", "zerodoc_world_size", "job",
                  help="Prometheus job of the training ranks (file_sd label `job`)."),
        labels_of("rank", 'zerodoc_world_size{job=~"$job"}', "rank", numeric=True,
                  help="Global rank(s)."),
        # "All" is ".+": a coarse rank's totals over units (no `unit` label) never show as
        # a unit.
        labels_of("unit", 'zerodoc_unit_parameters{job=~"$job"}', "unit", all=".+",
                  help="Sharded unit(s) (the module path FSDP wrapped; (root) is the root). "
                       "In coarse mode only the ranks of the unit sample have unit detail."),
    ]


# --------------------------------------------------------------------------------------
# queries and thresholds


def q(expr: str, legend: str = "", ref: str = "A", instant: bool = False,
      fmt: pm.PromQueryFormat | None = None) -> prometheus.Dataquery:
    d = prometheus.Dataquery().expr(expr).ref_id(ref).legend_format(legend or "__auto")
    d = d.instant() if instant else d.range()
    if fmt is not None:
        d = d.format(fmt)
    return d.editor_mode(pm.QueryEditorMode.CODE)


def steps(*pairs: tuple[float | None, str]) -> db.ThresholdsConfig:
    """Threshold steps: (None, base colour), (value, colour), ..."""
    return (db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in pairs]))


def rising(warn: float, crit: float | None = None) -> db.ThresholdsConfig:
    """Green below `warn`, yellow from it, red from `crit`."""
    pairs: list[tuple[float | None, str]] = [(None, "green"), (warn, "yellow")]
    if crit is not None:
        pairs.append((crit, "red"))
    return steps(*pairs)


def falling(crit: float, warn: float) -> db.ThresholdsConfig:
    """Red below `crit`, yellow below `warn`, green above (headroom)."""
    return steps((None, "red"), (crit, "yellow"), (warn, "green"))


def neutral() -> db.ThresholdsConfig:
    return steps((None, "green"))


# --------------------------------------------------------------------------------------
# panels


def _common(p, title: str, desc: str, unit: str, thresholds, w: int, h: int):
    return (p.title(title).description(desc).datasource(DS).unit(unit)
            .thresholds(thresholds or neutral()).span(w).height(h))


def ts(title: str, desc: str, targets: list, unit: str, thresholds=None, w: int = 12,
       h: int = 8, min_: float | None = None, line: bool = True) -> timeseries.Panel:
    p = _common(timeseries.Panel(), title, desc, unit, thresholds, w, h)
    p = (p.legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                  .placement(cm.LegendPlacement.BOTTOM).show_legend(True).calcs([]))
         .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                  .sort(cm.SortOrder.DESCENDING))
         .line_width(1).fill_opacity(8).show_points(cm.VisibilityMode.NEVER)
         .span_nulls(False))
    if thresholds is not None and line:
        p = p.thresholds_style(cb.GraphThresholdsStyleConfig()
                               .mode(cm.GraphThresholdsStyleMode.DASHED))
    if min_ is not None:
        p = p.min(min_)
    for t in targets:
        p = p.with_target(t)
    return p


def _reduce_last() -> cb.ReduceDataOptions:
    return cb.ReduceDataOptions().values(False).calcs(["lastNotNull"])


def big(title: str, desc: str, target, unit: str, thresholds=None, w: int = 4,
        h: int = 4) -> stat.Panel:
    p = _common(stat.Panel(), title, desc, unit, thresholds, w, h)
    return (p.reduce_options(_reduce_last()).graph_mode(cm.BigValueGraphMode.AREA)
            .color_mode(cm.BigValueColorMode.VALUE).text_mode(cm.BigValueTextMode.AUTO)
            .justify_mode(cm.BigValueJustifyMode.AUTO)
            .orientation(cm.VizOrientation.AUTO).with_target(target))


def bars(title: str, desc: str, target, unit: str, thresholds=None, w: int = 12, h: int = 8,
         min_: float | None = 0, max_: float | None = None) -> bargauge.Panel:
    p = _common(bargauge.Panel(), title, desc, unit, thresholds, w, h)
    p = (p.reduce_options(_reduce_last()).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
         .orientation(cm.VizOrientation.HORIZONTAL).show_unfilled(True)
         .value_mode(cm.BarGaugeValueMode.COLOR)
         .name_placement(cm.BarGaugeNamePlacement.LEFT).with_target(target))
    if min_ is not None:
        p = p.min(min_)
    if max_ is not None:
        p = p.max(max_)
    return p


def grid(title: str, desc: str, targets: list, unit: str, thresholds=None, w: int = 24,
         h: int = 8, hide: tuple[str, ...] = ("Time", "__name__"),
         merge: bool = False) -> table.Panel:
    p = _common(table.Panel(), title, desc, unit, thresholds, w, h)
    p = p.show_header(True).cell_height(cm.TableCellHeight.SM).filterable(True)
    if merge:
        p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(dm.DataTransformerConfig(
        id_val="organize", options={"excludeByName": {k: True for k in hide}}))
    for t in targets:
        p = p.with_target(t)
    return p


def cells(title: str, desc: str, target, cell_unit: str, thresholds=None, w: int = 24,
          h: int = 9) -> heatmap.Panel:
    """A heatmap whose rows are series (one per unit), coloured by value."""
    p = (heatmap.Panel().title(title).description(desc).datasource(DS).span(w).height(h)
         .thresholds(thresholds or neutral()).unit(cell_unit)
         .calculate(False)
         .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME)
                .scheme("Oranges").fill("dark-orange").scale(hm.HeatmapColorScale.EXPONENTIAL)
                .exponent(0.5).steps(64).reverse(False).min(0))
         .y_axis(heatmap.YAxisConfig().axis_placement(cm.AxisPlacement.LEFT).reverse(False))
         .cell_values(heatmap.CellValues().unit(cell_unit).decimals(1))
         .rows_frame(heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.UNKNOWN))
         .show_value(cm.VisibilityMode.NEVER).cell_gap(1)
         .mode(cm.TooltipDisplayMode.SINGLE).show_y_histogram().show_legend()
         .exemplars_color("rgba(255,0,255,0.7)"))
    return p.with_target(target)


def row(title: str) -> db.Row:
    return db.Row(title)


def links() -> list:
    return [db.DashboardLink("zerodoc").type(dm.DashboardLinkType.DASHBOARDS)
            .tags(["zerodoc"]).as_dropdown(True).include_vars(True).keep_time(True)
            .target_blank(False).icon("external link").tooltip("").url("")]
