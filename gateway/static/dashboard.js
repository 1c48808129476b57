// The plots page: the figures the server put in #figures, drawn with uPlot (shipped beside it).
"use strict";
(() => {
  const figures = JSON.parse(document.getElementById("figures").textContent);
  const seconds = (day) => Date.parse(day + "T12:00:00Z") / 1000;
  const width = () => Math.min(document.querySelector("main.page").clientWidth - 40, 900);

  function plot(id, rows, series) {
    const target = document.getElementById(id);
    if (!rows.length || typeof uPlot === "undefined") return;
    const data = [rows.map((r) => seconds(r.day)), ...series.map((s) => rows.map((r) => r[s.key]))];
    const opts = {
      width: width(), height: 220,
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2, points: { show: true } }))],
      axes: [{}, { size: 60 }],
    };
    new uPlot(opts, data, target);
  }

  plot("plot-latency", figures.latency, [
    { key: "p50", label: "median ms", color: "#0a84ff" },
    { key: "p99", label: "p99 ms", color: "#d70015" },
  ]);
  // The judge's grades: x is the point (1..7), one line of pass rates per model.
  (() => {
    const grades = figures.grades, target = document.getElementById("plot-grades");
    if (!grades || !grades.models.length || typeof uPlot === "undefined") return;
    const colors = ["#0a84ff", "#d70015", "#067d2b", "#8e8e93", "#bf5af2", "#ff9f0a"];
    const x = grades.points.map((_, i) => i + 1);
    const opts = {
      width: width(), height: 240, scales: { x: { time: false }, y: { range: [0, 100] } },
      series: [{ label: "point" }, ...grades.models.map((m, i) => (
        { label: m.model, stroke: colors[i % colors.length], width: 2, points: { show: true } }))],
      axes: [{ values: (u, ticks) => ticks.map((t) => grades.points[t - 1] || "") }, { size: 50 }],
    };
    new uPlot(opts, [x, ...grades.models.map((m) => m.pass_rate)], target);
  })();

  plot("plot-turns", figures.usage, [{ key: "turns", label: "turns", color: "#0a84ff" }]);
  plot("plot-tokens", figures.usage, [
    { key: "input_tokens", label: "input tokens", color: "#8e8e93" },
    { key: "output_tokens", label: "output tokens", color: "#067d2b" },
  ]);
})();
