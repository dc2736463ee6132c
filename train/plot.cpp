// train/plot.cpp: see plot.h. Plain SVG: two polylines on linear axes with a few labelled ticks.
#include "plot.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace fg {
namespace {

struct Point {
    double step, loss;
};

std::string number(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g", v);
    return buf;
}

}  // namespace

void write_loss_curve(const std::string& metrics_jsonl, const std::string& svg_path,
                      const std::string& title) {
    std::ifstream in(metrics_jsonl);
    FG_CHECK(in.good(), "plot", "cannot read '", metrics_jsonl, "'");
    std::vector<Point> train, val;
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        if (j.is_discarded() || !j.contains("step")) continue;
        double step = j["step"].get<double>();
        if (j.contains("loss")) train.push_back({step, j["loss"].get<double>()});
        if (j.contains("val_loss")) val.push_back({step, j["val_loss"].get<double>()});
    }
    const double w = 800, h = 450, left = 70, right = 20, top = 40, bottom = 50;
    double max_step = 1, max_loss = 1e-9, min_loss = 1e300;
    for (const auto* series : {&train, &val})
        for (const Point& p : *series) {
            max_step = std::max(max_step, p.step);
            max_loss = std::max(max_loss, p.loss);
            min_loss = std::min(min_loss, p.loss);
        }
    if (min_loss > max_loss) min_loss = 0;
    min_loss = std::min(0.0, min_loss);
    auto x = [&](double s) { return left + (w - left - right) * s / max_step; };
    auto y = [&](double l) { return top + (h - top - bottom) * (1 - (l - min_loss) / (max_loss - min_loss)); };
    auto polyline = [&](const std::vector<Point>& pts, const char* colour, double width) {
        std::ostringstream s;
        s << "<polyline fill=\"none\" stroke=\"" << colour << "\" stroke-width=\"" << width << "\" points=\"";
        for (const Point& p : pts) s << number(x(p.step)) << "," << number(y(p.loss)) << " ";
        s << "\"/>\n";
        return s.str();
    };
    std::ostringstream svg;
    svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
        << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
        << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        << "<text x=\"" << w / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" << title
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
        << ")\" text-anchor=\"middle\">loss</text>\n"
        << polyline(train, "#1f77b4", 1.2) << polyline(val, "#d62728", 2.0);
    for (const Point& p : val)
        svg << "<circle cx=\"" << number(x(p.step)) << "\" cy=\"" << number(y(p.loss))
            << "\" r=\"3\" fill=\"#d62728\"/>\n";
    svg << "<text x=\"" << w - right - 150 << "\" y=\"" << top + 15 << "\" fill=\"#1f77b4\">train loss</text>\n"
        << "<text x=\"" << w - right - 150 << "\" y=\"" << top + 32 << "\" fill=\"#d62728\">validation loss</text>\n"
        << "</svg>\n";
    std::string tmp = svg_path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << svg.str();
        FG_CHECK(out.good(), "plot", "cannot write '", tmp, "'");
    }
    FG_CHECK(std::rename(tmp.c_str(), svg_path.c_str()) == 0, "plot", "cannot rename '", tmp, "'");
}

}  // namespace fg
