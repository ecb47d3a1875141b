set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/realistic/fig11.png'
set title 'fig11: mean TPOT vs load, 8P16D, Qwen3-30B-A3B (held out)'
set xlabel 'load (share of estimated capacity)'
set ylabel 'mean TPOT (ms)'
$d0 << EOD
0.2 6.87415
0.4 10.9285
0.6 13.0418
0.8 14.0531
0.95 14.4743
EOD
$d1 << EOD
0.2 6.33625
0.4 10.8332
0.6 13.0177
0.8 14.0356
0.95 14.479
EOD
$d2 << EOD
0.2 6.28851
0.4 10.8317
0.6 13.0247
0.8 14.0419
0.95 14.4856
EOD
$d3 << EOD
0.2 6.4376
0.4 10.8484
0.6 13.0302
0.8 14.0486
0.95 14.4909
EOD
$d4 << EOD
0.2 6.43662
0.4 9.78441
0.6 11.6846
0.8 12.7038
0.95 13.1433
EOD
$d5 << EOD
0.2 6.8062
0.4 10.9202
0.6 12.9615
0.8 13.9176
0.95 14.3104
EOD
set key below
plot $d0 using 1:2 with linespoints lt 1 dt 1 title 'random', $d1 using 1:2 with linespoints lt 2 dt 1 title 'rr', $d2 using 1:2 with linespoints lt 3 dt 1 title 'jsq', $d3 using 1:2 with linespoints lt 4 dt 1 title 'p2c', $d4 using 1:2 with linespoints lt 5 dt 1 title 'eldr', $d5 using 1:2 with linespoints lt 6 dt 1 title 'eldr-permuted'
