// cli/plot.cpp: see plot.h. Plain SVG: polylines on linear axes with a few labelled ticks; per
// run a thin line for the training loss and a thick one with dots for the validation loss.
#include "plot.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "train/checkpoint.h"
#include "core/error.h"

namespace fg {
namespace {

// Text as SVG (XML) character data: titles and labels come from the command line.
std::string xml_escape(const std::string& text) {
    std::string out;
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            default: out += c;
        }
    }
    return out;
}

struct Point {
    double step, loss;
};

struct Series {
    std::string label;
    std::vector<Point> train, val;
};

std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

Series read_metrics(const LossCurveSource& source) {
    std::error_code ec;
    FG_CHECK(!std::filesystem::is_directory(source.metrics_jsonl, ec), "plot", "'",
             source.metrics_jsonl, "' is a directory, not a metrics file (give its metrics.jsonl)");
    std::ifstream in(source.metrics_jsonl);
    FG_CHECK(in.good(), "plot", "cannot read '", source.metrics_jsonl, "'");
    Series s{source.label, {}, {}};
    std::string line;
    while (std::getline(in, line)) {
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        // Numbers only: the trainer writes a non-finite value as null.
        const auto number = [&j](const char* key) { return j.contains(key) && j[key].is_number(); };
        if (j.is_discarded() || !number("step")) continue;
        const double step = j["step"].get<double>();
        // A step past 1e15 or below 0 is no training step (and would put the axis at infinity).
        if (!(step >= 0 && step <= 1e15)) continue;
        auto finite = [&](const char* key) {
            return number(key) && std::isfinite(j[key].get<double>());
        };
        if (finite("loss")) s.train.push_back({step, j["loss"].get<double>()});
        if (finite("val_loss")) s.val.push_back({step, j["val_loss"].get<double>()});
    }
    FG_CHECK(!s.train.empty() || !s.val.empty(), "plot", "'", source.metrics_jsonl,
             "' holds no line with a step and a finite loss: nothing to plot (is it a fusegrad "
             "metrics.jsonl?)");
    return s;
}

}  // namespace

void write_loss_curves(const std::vector<LossCurveSource>& runs, const std::string& svg_path,
                       const std::string& title, double y_max) {
    FG_CHECK(!runs.empty(), "plot", "no metrics files to plot");
    std::vector<Series> series;
    for (const LossCurveSource& r : runs) series.push_back(read_metrics(r));
    const double w = 800, h = 450, left = 70, right = 20, top = 40, bottom = 50;
    double max_step = 1, max_loss = 1e-9, min_loss = 1e300;
    for (const Series& s : series)
        for (const auto* points : {&s.train, &s.val})
            for (const Point& p : *points) {
                max_step = std::max(max_step, p.step);
                max_loss = std::max(max_loss, p.loss);
                min_loss = std::min(min_loss, p.loss);
            }
    if (min_loss > max_loss) min_loss = 0;
    if (y_max > 0) max_loss = y_max;
    min_loss = std::max(0.0, std::floor(min_loss * 2) / 2 - 0.5);  // a round floor below the data
    auto x = [&](double s) { return left + (w - left - right) * s / max_step; };
    auto y = [&](double l) {
        l = std::min(l, max_loss);
        return top + (h - top - bottom) * (1 - (l - min_loss) / (max_loss - min_loss));
    };
    auto polyline = [&](const std::vector<Point>& pts, const std::string& colour, double width,
                        double opacity) {
        std::ostringstream s;
        s << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"" << width
          << "\" stroke-opacity=\"" << opacity << "\" points=\"";
        for (const Point& p : pts) s << number(x(p.step)) << "," << number(y(p.loss)) << " ";
        s << "\"/>\n";
        return s.str();
    };
    const std::string title_text = xml_escape(title);
    std::ostringstream svg;
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
        << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        << "<text x=\"" << w / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << title_text
        << "</text>\n";
    for (int i = 0; i <= 4; ++i) {  // grid and tick labels
        double l = min_loss + (max_loss - min_loss) * i / 4, s = max_step * i / 4;
        svg << "<line x1=\"" << left << "\" x2=\"" << w - right << "\" y1=\"" << number(y(l))
            << "\" y2=\"" << number(y(l)) << "\" stroke=\"#ddd\"/>\n"
            << "<text x=\"" << left - 6 << "\" y=\"" << number(y(l) + 4) << "\" text-anchor=\"end\">"
            << number(l) << "</text>\n"
            << "<text x=\"" << number(x(s)) << "\" y=\"" << h - bottom + 18
            << "\" text-anchor=\"middle\">" << number(s) << "</text>\n";
    }
    svg << "<text x=\"" << w / 2 << "\" y=\"" << h - 10 << "\" text-anchor=\"middle\">step</text>\n"
        << "<text x=\"16\" y=\"" << h / 2 << "\" transform=\"rotate(-90 16 " << h / 2
        << ")\" text-anchor=\"middle\">loss</text>\n";
    // One label: blue train, red validation. Several: one colour per label, both lines in it;
    // runs under the same label (seeds of one setup) share its colour and its legend lines.
    static const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
    std::vector<std::string> labels;  // distinct, in order of first appearance
    for (const Series& s : series)
        if (!std::count(labels.begin(), labels.end(), s.label)) labels.push_back(s.label);
    const bool single = labels.size() == 1;
    auto colour = [&](std::size_t i, bool val) { return single ? palette[val] : palette[i % 6]; };
    for (const Series& s : series) {
        const std::size_t i = std::find(labels.begin(), labels.end(), s.label) - labels.begin();
        const std::string train_colour = colour(i, false), val_colour = colour(i, true);
        svg << polyline(s.train, train_colour, 1.0, single ? 1.0 : 0.45)
            << polyline(s.val, val_colour, 2.0, 1.0);
        for (const Point& p : s.val)
            svg << "<circle cx=\"" << number(x(p.step)) << "\" cy=\"" << number(y(p.loss))
                << "\" r=\"3\" fill=\"" << val_colour << "\"/>\n";
    }
    double legend_y = top + 15;
    for (std::size_t i = 0; i < labels.size(); ++i) {
        bool train = false, val = false;
        for (const Series& s : series) {
            if (s.label != labels[i]) continue;
            train = train || !s.train.empty();
            val = val || !s.val.empty();
        }
        const std::string prefix = labels[i].empty() ? "" : xml_escape(labels[i]) + ": ";
        auto legend = [&](bool is_val, const char* what) {
            svg << "<text x=\"" << w - right - 260 << "\" y=\"" << legend_y << "\" fill=\""
                << colour(i, is_val) << "\">" << prefix << what << "</text>\n";
            legend_y += 17;
        };
        if (train) legend(false, "train loss (thin)");
        if (val) legend(true, "validation loss (dots)");
    }
    svg << "</svg>\n";
    write_file_durably(svg_path, svg.str(), "plot");  // a failed write leaves no .tmp behind
}

}  // namespace fg
